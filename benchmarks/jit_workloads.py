"""JIT workloads: hybridnet compiled vs eager vs NumPy vs PyTorch / torch.compile / jax.jit.

    python benchmarks/jit_workloads.py [w1 w3 mlp w4 compile] [--quick]

All times are medians of repeated runs measured in this one process (compile
latency runs in fresh processes). Ratios: lower is better for "x floor" and
"vs hn compiled" columns.
"""

import argparse
import math
import os
import subprocess
import sys
import time

import numpy as np
from _common import fmt_time, median_time, optional, print_table

import hybridnet as hn

C = math.sqrt(2.0 / math.pi)


# ---- W1: an elementwise chain ----------------------------------------------------------------

def w1_hn(x):
    y = x * 1.5 + 0.1
    return hn.gelu(y, approximate="tanh") * hn.sigmoid(x) + 0.5 * x


def w1_numpy(x):
    y = x * np.float32(1.5) + np.float32(0.1)
    g = np.float32(0.5) * y * (np.float32(1) + np.tanh(np.float32(C) * (y + np.float32(0.044715)
                                                                          * y * y * y)))
    return g * (np.float32(1) / (np.float32(1) + np.exp(-x))) + np.float32(0.5) * x


def _torch_w1(torch):
    def f(x):
        y = x * 1.5 + 0.1
        return torch.nn.functional.gelu(y, approximate="tanh") * torch.sigmoid(x) + 0.5 * x
    return f


def _jax_w1(jax):
    def f(x):
        y = x * 1.5 + 0.1
        return jax.nn.gelu(y, approximate=True) * jax.nn.sigmoid(x) + 0.5 * x
    return f


def _numba_loop():
    """A hand-written Numba loop for W1 with the same float32 math (compiler.lowering
    .mathlib: 1 ulp), one thread: what a user could write by hand."""
    from numba import njit

    from compiler.lowering.mathlib import sigmoid_f32, tanh_f32
    c, k = np.float32(C), np.float32(0.044715)
    h, a, b = np.float32(0.5), np.float32(1.5), np.float32(0.1)

    @njit(fastmath={"reassoc", "contract"}, error_model="numpy")
    def loop(x, out):
        for i in range(x.size):
            v = x[i]
            y = v * a + b
            g = h * y * (np.float32(1) + tanh_f32(c * (y + k * y * y * y)))
            out[i] = g * sigmoid_f32(v) + h * v
    return loop


def _w1_row(n, traced, torch, jax, extra):
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x = hn.from_numpy(a)
    dst = np.empty_like(a)
    repeat = 5 if n >= 2 ** 24 else 9
    with hn.no_grad():
        for f in extra.values():
            f(x), f(x)
        traced(x), traced(x)
        row = {"n": n, "floor": median_time(lambda: np.copyto(dst, a), repeat),
               "compiled": median_time(lambda: traced(x), repeat),
               "eager": median_time(lambda: w1_hn(x), repeat),
               "numpy": median_time(lambda: w1_numpy(a), repeat),
               "max_err": float(np.abs(traced(x).numpy() - w1_numpy(a)).max())}
        for name, f in extra.items():
            row[name] = median_time(lambda f=f: f(x), repeat)
            row["max_err"] = max(row["max_err"], float(np.abs(f(x).numpy() -
                                                               w1_numpy(a)).max()))
    loop = _numba_loop()
    loop(a, dst)
    row["numba loop"] = median_time(lambda: loop(a, dst), repeat)
    if torch is not None:
        t = torch.from_numpy(a)
        tf = _torch_w1(torch)
        row["torch"] = median_time(lambda: tf(t), repeat)
        row["torch.compile"] = _torch_compiled(torch, tf, t, repeat)
    if jax is not None:
        jf = jax.jit(_jax_w1(jax))
        ja = jax.numpy.asarray(a)
        jf(ja).block_until_ready()
        row["jax.jit"] = median_time(lambda: jf(ja).block_until_ready(), repeat)
    return row


def bench_w1(quick):
    torch, jax = optional("torch"), _jax()
    sizes = [2 ** 16, 2 ** 20] if quick else [2 ** 16, 2 ** 20, 2 ** 24]
    traced = hn.trace(w1_hn, backend="numba")
    extra = {"llvm": hn.trace(w1_hn, backend="llvm")}
    rows = [_w1_row(n, traced, torch, jax, extra) for n in sizes]
    impls = ("compiled", "llvm", "eager", "numpy", "numba loop", "torch", "torch.compile",
             "jax.jit")
    table = []
    for r in rows:
        line = {"n": f"2^{int(math.log2(r['n']))}", "floor": fmt_time(r["floor"]),
                "err": f"{r['max_err']:.1e}"}
        for k in impls:
            v = r.get(k)
            line[k] = "-" if v is None else f"{fmt_time(v)} ({v / r['floor']:.1f}x)"
        table.append(line)
    cols = [("n", "N", str), ("floor", "copy floor", str)] + \
        [(k, k, str) for k in impls] + [("err", "max|err| vs numpy", str)]
    print_table("W1: gelu_tanh(x*1.5+0.1) * sigmoid(x) + 0.5*x, float32; time (multiple of "
                "the memory-bandwidth floor: np.copyto, read + write); compiled = hn.trace "
                "backend numba, llvm = backend llvm; numba loop = hand-written, 1 thread",
                table, cols)
    return rows


def _floor_fmt(key):
    def f(v, key=key):
        return "-" if v is None else fmt_time(v)
    return f


def _torch_compiled(torch, fn, t, repeat):
    try:
        cf = torch.compile(fn)
        cf(t)
        return median_time(lambda: cf(t), repeat)
    except Exception as exc:  # noqa: BLE001  (report, don't crash the benchmark)
        print(f"  torch.compile unavailable: {type(exc).__name__}: {exc}"[:200])
        return None


def _jax():
    jax = optional("jax")
    if jax is not None:
        import jax.numpy  # noqa: F401
    return jax


# ---- W3: per-call overhead ------------------------------------------------------------------

def bench_w3(quick):
    torch, jax = optional("torch"), _jax()
    a = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    x = hn.from_numpy(a)
    f = hn.trace(lambda t: (t * 2.0 + 1.0).tanh())
    with hn.no_grad():
        f(x), f(x)
        row = {"compiled": median_time(lambda: f(x)),
               "eager": median_time(lambda: (x * 2.0 + 1.0).tanh())}
    kernel = next(iter(f.specializations.values())).traces[0].result.kernel.fn
    row["bare numba call"] = median_time(lambda: kernel(a))
    row["numpy"] = median_time(lambda: np.tanh(a * np.float32(2) + np.float32(1)))
    if torch is not None:
        t = torch.from_numpy(a)
        tf = lambda v: torch.tanh(v * 2 + 1)  # noqa: E731
        row["torch"] = median_time(lambda: tf(t))
        row["torch.compile"] = _torch_compiled(torch, tf, t, 7)
    if jax is not None:
        jf = jax.jit(lambda v: jax.numpy.tanh(v * 2 + 1))
        ja = jax.numpy.asarray(a)
        jf(ja).block_until_ready()
        row["jax.jit"] = median_time(lambda: jf(ja).block_until_ready())
    rows = [{"impl": k, "t": v, "ratio": v / row["compiled"] if v else None}
            for k, v in row.items() if v is not None]
    print_table("W3: per-call cost of tanh(x*2+1) on 16 float32 elements", rows,
                [("impl", "implementation", str), ("t", "per call", fmt_time),
                 ("ratio", "vs hn compiled", lambda v: f"{v:.2f}x")])
    return rows


# ---- MLP inference ------------------------------------------------------------------------

def _mlp():
    hn.manual_seed(0)
    return hn.nn.Sequential(hn.nn.Linear(784, 256), hn.nn.ReLU(), hn.nn.Linear(256, 256),
                            hn.nn.ReLU(), hn.nn.Linear(256, 10), hn.nn.Softmax(1))


def bench_mlp(quick):
    torch, jax = optional("torch"), _jax()
    model = _mlp()
    traced = hn.trace(model)
    a = np.random.default_rng(0).standard_normal((64, 784)).astype(np.float32)
    x = hn.from_numpy(a)
    ws = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in model
          if isinstance(m, hn.nn.Linear)]

    def np_mlp(v):
        for i, (w, b) in enumerate(ws):
            v = v @ w.T + b
            if i < 2:
                v = np.maximum(v, 0)
        e = np.exp(v - v.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    with hn.no_grad():
        traced(x), traced(x)
        row = {"compiled": median_time(lambda: traced(x)), "eager": median_time(lambda: model(x))}
        err = float(np.abs(traced(x).numpy() - np_mlp(a)).max())
    row["numpy"] = median_time(lambda: np_mlp(a))
    if torch is not None:
        tm = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                 torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                 torch.nn.Linear(256, 10), torch.nn.Softmax(1)).eval()
        t = torch.from_numpy(a)
        with torch.no_grad():
            row["torch"] = median_time(lambda: tm(t))
            row["torch.compile"] = _torch_compiled(torch, tm, t, 7)
    if jax is not None:
        jnp = jax.numpy
        jws = [(jnp.asarray(w), jnp.asarray(b)) for w, b in ws]

        def jf(v):
            for i, (w, b) in enumerate(jws):
                v = v @ w.T + b
                if i < 2:
                    v = jnp.maximum(v, 0)
            return jax.nn.softmax(v, axis=1)
        jf = jax.jit(jf)
        ja = jnp.asarray(a)
        jf(ja).block_until_ready()
        row["jax.jit"] = median_time(lambda: jf(ja).block_until_ready())
    rows = [{"impl": k, "t": v, "ratio": v / row["compiled"]} for k, v in row.items()
            if v is not None]
    print_table(f"MLP inference 784-256-256-10, batch 64 (max |err| vs numpy {err:.1e})", rows,
                [("impl", "implementation", str), ("t", "per call", fmt_time),
                 ("ratio", "vs hn compiled", lambda v: f"{v:.2f}x")])
    return rows


# ---- W4: an RNN cell over sequences of many lengths ---------------------------------------

def bench_w4(quick):
    hn.manual_seed(0)
    cell = hn.nn.RNNCell(64, 128)
    step = hn.trace(cell)
    rng = np.random.default_rng(0)
    n_seq = 40 if quick else 200
    seqs = [hn.from_numpy(rng.standard_normal((int(rng.integers(8, 65)), 32, 64))
                          .astype(np.float32)) for _ in range(n_seq)]

    def run(fn):
        start = time.perf_counter()
        with hn.no_grad():
            for seq in seqs:
                h = hn.zeros(32, 128)
                for t in range(seq.shape[0]):
                    h = fn(seq[t], h)
        return time.perf_counter() - start

    eager, compiled = run(cell), run(step)
    steps = sum(s.shape[0] for s in seqs)
    rows = [{"impl": "hn compiled (incl. compiles)", "t": compiled},
            {"impl": "hn eager", "t": eager}]
    print_table(f"W4: tanh RNNCell(64, 128), batch 32, {n_seq} sequences of lengths 8..64 "
                f"({steps} steps); compiles: {step.stats.compiles}, traces: "
                f"{step.stats.traces}", rows,
                [("impl", "implementation", str), ("t", "total", fmt_time)])
    return rows


# ---- compile latency in a fresh process ---------------------------------------------------

_COLD = r"""
import time, numpy as np
t0 = time.perf_counter()
import hybridnet as hn
t1 = time.perf_counter()
{setup}
with hn.no_grad():
    f(x)
    t2 = time.perf_counter()
    f(x)
t3 = time.perf_counter()
print(f"{{t1 - t0:.4f}} {{t2 - t1:.4f}} {{t3 - t2:.4f}}")
"""

_W1_SETUP = """
def w1(x):
    y = x * 1.5 + 0.1
    return hn.gelu(y, approximate="tanh") * hn.sigmoid(x) + 0.5 * x
f = hn.trace(w1, backend={backend!r})
x = hn.randn(2 ** 16)
"""

_MLP_SETUP = """
m = hn.nn.Sequential(hn.nn.Linear(784, 256), hn.nn.ReLU(), hn.nn.Linear(256, 256),
                     hn.nn.ReLU(), hn.nn.Linear(256, 10), hn.nn.Softmax(1))
f = hn.trace(m, backend={backend!r})
x = hn.randn(64, 784)
"""

_JAX_COLD = r"""
import sys, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
t1 = time.perf_counter()
{setup}
t2 = time.perf_counter()
f(x).block_until_ready()
t3 = time.perf_counter()
print(f"{{t1 - t0:.4f}} {{t2 - t1:.4f}} {{t3 - t2:.4f}}")
"""

_JAX_W1 = """
@jax.jit
def f(x):
    y = x * 1.5 + 0.1
    return jax.nn.gelu(y, approximate=True) * jax.nn.sigmoid(x) + 0.5 * x
x = jnp.asarray(jax.random.normal(jax.random.PRNGKey(0), (2 ** 16,)))
"""


def _cold_run(setup, cache_dir, jax=False):
    code = (_JAX_COLD if jax else _COLD).format(setup=setup)
    env = dict(os.environ, HYBRIDNET_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code, cache_dir], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    return map(float, out)


def bench_compile(quick):
    """Time to the first compiled result in fresh processes, per backend, with an empty
    and with a warm disk cache ("first result" = first call + compiling call)."""
    import tempfile
    rows = []
    cases = [(f"{name} {backend}", setup.format(backend=backend), False)
             for name, setup in (("W1", _W1_SETUP), ("MLP", _MLP_SETUP))
             for backend in ("numba", "llvm")]
    if _jax() is not None:
        cases.insert(2, ("W1 jax.jit", _JAX_W1, True))
    for name, setup, is_jax in cases:
        with tempfile.TemporaryDirectory() as cache_dir:
            for label in ("cold (empty cache)", "new process, warm disk cache"):
                imp, first, second = _cold_run(setup, cache_dir, is_jax)
                rows.append({"workload": f"{name}: {label}", "import": imp, "trace": first,
                             "compile": second, "total": first + second})
    print_table("Time to the first compiled result in a fresh process (hn: the first call "
                "records and runs eagerly; llvm compiles there, numba at the second call; "
                "jax.jit: its one first call)", rows,
                [("workload", "workload", str), ("import", "import", fmt_time),
                 ("trace", "first call", fmt_time),
                 ("compile", "second call", fmt_time),
                 ("total", "first compiled result, from the first call", fmt_time)])
    return rows


WORKLOADS = {"w1": bench_w1, "w3": bench_w3, "mlp": bench_mlp, "w4": bench_w4,
             "compile": bench_compile}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer sequences")
    args = parser.parse_args()
    for name in args.workloads:
        WORKLOADS[name](args.quick)


if __name__ == "__main__":
    main()
