"""Per-op eager overhead of two source trees, measured in one run (A/B).

    python benchmarks/eager_ab.py BASE_REV [--rounds 7] [--number 20000]

Checks BASE_REV out into a temporary git worktree, then alternates child processes
(base, this tree, base, this tree, ...) that each time every case on 16-element
float32 tensors. The figure per case is the median over the rounds of each child's
best-of-5 per-call time, in microseconds; `new/base` above 1.05 means this tree is
more than 5% slower. Alternating the trees spreads a busy neighbour over both.
The cases cover every dispatch path: tensor-tensor and tensor-scalar binaries,
unary, reductions, matmul, movement, indexing, casts, composites and a call that
records for autograd.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, timeit
import numpy as np
import hybridnet as hn
number = int(sys.argv[1])
rng = np.random.default_rng(0)
a = hn.tensor(rng.standard_normal(16).astype(np.float32))
b = hn.tensor(rng.standard_normal(16).astype(np.float32))
m = hn.tensor(rng.standard_normal((4, 4)).astype(np.float32))
i = hn.tensor(np.arange(16))
g = hn.tensor(rng.standard_normal(16).astype(np.float32), requires_grad=True)
cases = {
    "a + b": lambda: a + b,
    "a * b": lambda: a * b,
    "a + 1.0": lambda: a + 1.0,
    "2.0 * a": lambda: 2.0 * a,
    "a + 1 (int)": lambda: a + 1,
    "i + i (int64)": lambda: i + i,
    "a < b": lambda: a < b,
    "-a": lambda: -a,
    "a.tanh()": lambda: a.tanh(),
    "a.exp()": lambda: a.exp(),
    "a.sum()": lambda: a.sum(),
    "m @ m": lambda: m @ m,
    "hn.relu(a)": lambda: hn.relu(a),
    "a.reshape(4, 4)": lambda: a.reshape(4, 4),
    "m.T": lambda: m.T,
    "a[3]": lambda: a[3],
    "a.double()": lambda: a.double(),
    "softmax(m, -1)": lambda: hn.softmax(m, -1),
    "a.add_(1.0)": lambda: a.add_(1.0),
    "g * b (grad)": lambda: g * b,
    "g * 2.0 (grad)": lambda: g * 2.0,
    "g.tanh() (grad)": lambda: g.tanh(),
}
out = {}
for name, fn in cases.items():
    fn()
    out[name] = min(timeit.repeat(fn, repeat=5, number=number)) / number * 1e6
print(json.dumps(out))
"""


def _child(root, number):
    env = dict(os.environ, PYTHONPATH=root, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(number)], cwd=root, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def _worktree(rev):
    path = tempfile.mkdtemp(prefix="hn-ab-")
    os.rmdir(path)
    subprocess.run(["git", "worktree", "add", "--detach", path, rev], cwd=HERE, check=True,
                   capture_output=True)
    return path


def run(rev, rounds, number):
    """{case: (base us, new us)}: medians over `rounds` alternating child runs."""
    base = _worktree(rev)
    try:
        runs = {"base": [], "new": []}
        for _ in range(rounds):
            runs["base"].append(_child(base, number))
            runs["new"].append(_child(HERE, number))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", base], cwd=HERE,
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    cases = runs["base"][0]
    return {c: (statistics.median(r[c] for r in runs["base"]),
                statistics.median(r[c] for r in runs["new"])) for c in cases}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the base revision (a commit, tag or branch)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    table = run(args.rev, args.rounds, args.number)
    print(f"{'case':<18}{'base us':>9}{'new us':>9}{'new/base':>10}")
    for case, (old, new) in table.items():
        flag = "  slower" if new / old > 1.05 else ""
        print(f"{case:<18}{old:>9.3f}{new:>9.3f}{new / old:>10.3f}{flag}")
    ratios = [new / old for old, new in table.values()]
    print(f"\nmedian new/base {statistics.median(ratios):.3f}, worst {max(ratios):.3f} "
          f"({args.rounds} alternating rounds, best of 5 x {args.number} calls each)")


if __name__ == "__main__":
    main()
