"""Per-op eager dispatch overhead on small tensors: hybridnet vs NumPy vs PyTorch.

    python benchmarks/eager_overhead.py [--repeat 15] [--number 2000]

Each figure is the median over `repeat` runs of `number` calls, in microseconds per
call, all measured in this one process; ratios are hybridnet / peer (lower is better).
No grad is recorded (inputs do not require grad), which is the inference fast path.
"""

import argparse
import statistics
import timeit

import numpy as np

import hybridnet as hn


def _per_call_us(fn, repeat, number) -> float:
    fn()
    runs = timeit.repeat(fn, repeat=repeat, number=number)
    return statistics.median(runs) / number * 1e6


def _operands(n):
    side = int(round(n ** 0.5))
    rng = np.random.default_rng(0)
    vec = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    mat = [rng.standard_normal((side, side)).astype(np.float32) for _ in range(2)]
    return vec, mat


def _cases(n):
    vec, mat = _operands(n)
    cases = {
        "add": (vec, lambda a, b: a + b),
        "mul": (vec, lambda a, b: a * b),
        "matmul": (mat, lambda a, b: a @ b),
        "tanh": (vec, lambda a, b: a.tanh() if hasattr(a, "tanh") else np.tanh(a)),
        "sum": (vec, lambda a, b: a.sum()),
    }
    return cases


def _bind(op, a, b):
    return lambda: op(a, b)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def run(sizes, repeat, number):
    torch = _torch()
    rows = []
    for n in sizes:
        for name, (arrays, op) in _cases(n).items():
            a_np, b_np = arrays
            a_hn, b_hn = hn.tensor(a_np), hn.tensor(b_np)
            row = {"op": name, "n": n,
                   "numpy": _per_call_us(_bind(op, a_np, b_np), repeat, number),
                   "hybridnet": _per_call_us(_bind(op, a_hn, b_hn), repeat, number)}
            if torch is not None:
                a_t, b_t = torch.from_numpy(a_np), torch.from_numpy(b_np)
                row["torch"] = _per_call_us(_bind(op, a_t, b_t), repeat, number)
            rows.append(row)
    return rows, torch


def _print(rows, torch):
    head = f"{'op':<8}{'elems':>6}{'numpy us':>10}{'hn us':>9}{'hn/numpy':>10}"
    if torch is not None:
        head += f"{'torch us':>10}{'hn/torch':>10}"
    print(head)
    for r in rows:
        line = (f"{r['op']:<8}{r['n']:>6}{r['numpy']:>10.2f}{r['hybridnet']:>9.2f}"
                f"{r['hybridnet'] / r['numpy']:>10.2f}")
        if torch is not None:
            line += f"{r['torch']:>10.2f}{r['hybridnet'] / r['torch']:>10.2f}"
        print(line)
    if torch is not None:
        ratios = [r["hybridnet"] / r["torch"] for r in rows]
        print(f"\nhybridnet eager / PyTorch {torch.__version__} eager: median "
              f"{statistics.median(ratios):.2f}x, worst {max(ratios):.2f}x")
    else:
        print("\n(PyTorch not installed: no PyTorch column)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 1024])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    _print(*run(args.sizes, args.repeat, args.number))


if __name__ == "__main__":
    main()
