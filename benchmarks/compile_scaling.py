"""Compile time and peak memory against graph length: long traces are split into kernels.

    python benchmarks/compile_scaling.py [--quick] [--unsplit] [--backend numba|llvm]

Workloads, each unrolled over its time steps by the Python loop inside the traced
function (under hn.no_grad()):
  rnn   h = tanh(x_t @ W + h @ U + b), float64, batch 8, input 16, hidden 64;
  lstm  two hn.nn.LSTMCell(51) and a Linear(51, 1) on a sine wave, float64, batch 10
        (PyTorch's "time_sequence_prediction" example).
Every size runs in fresh processes: "cold" with an empty kernel cache folder, then
"warm", a second process on the same folder. trace = the first call (eager run while
recording, optimize, lower); compile = the second call (Numba compile or disk load plus
the first compiled run); peak MB = the process's peak RSS (getrusage ru_maxrss), with
the RSS after importing hybridnet shown apart. Per-call times (median, warm process):
eager vs compiled. --unsplit adds the same workloads compiled as one Numba function
(HYBRIDNET_KERNEL_BUDGET very large: the behaviour before splitting) at small sizes,
with a time limit.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from _common import fmt_time, print_table

HERE = os.path.dirname(os.path.abspath(__file__))

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {here!r})
sys.path.insert(0, {examples!r})
import numpy as np
import hybridnet as hn
from _common import median_time
from time_sequence import Sequence, sine_wave

def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def rnn(steps):
    rng = np.random.default_rng(0)
    batch, n_in, hidden = 8, 16, 64
    x = hn.tensor(rng.standard_normal((steps, batch, n_in)))
    w = hn.tensor(rng.standard_normal((n_in, hidden)) * 0.3)
    u = hn.tensor(rng.standard_normal((hidden, hidden)) * 0.1)
    b = hn.tensor(rng.standard_normal(hidden) * 0.1)

    def step_all(x, w, u, b):
        h = hn.zeros(batch, hidden, dtype=np.float64)
        for t in range(x.shape[0]):
            h = hn.tanh(x[t] @ w + h @ u + b)
        return h
    return step_all, (x, w, u, b)

def lstm(steps):
    hn.manual_seed(0)
    return Sequence(), (sine_wave(steps),)

fn, args = {kind}({steps})
base = rss_mb()
traced = hn.trace(fn, backend={backend!r}, dynamic={dynamic!r})
with hn.no_grad():
    t0 = time.perf_counter()
    traced(*args)
    t1 = time.perf_counter()
    out = traced(*args)
    t2 = time.perf_counter()
    peak = rss_mb()
    err = float(np.max(np.abs(out.numpy() - fn(*args).numpy())))
    row = dict(trace=t1 - t0, compile=t2 - t1, peak=peak, base=base, err=err,
               compiled=traced.stats.compiled_calls)
    kernel = next(iter(traced.specializations.values())).traces[0].result.kernel
    row["kernels"] = len(getattr(kernel, "parts", [kernel]))
    row["calls"] = kernel.source.count("= c") if hasattr(kernel, "parts") else 1
    row["disk_hits"] = kernel.cache_hits
    if {timing}:
        row["eager"] = median_time(lambda: fn(*args), repeat=5)
        row["per_call"] = median_time(lambda: traced(*args), repeat=5)
print("ROW " + json.dumps(row))
"""


BACKEND = {"name": "numba"}  # (--backend)


def run_child(kind, steps, cache_dir, timing, env_extra=None, timeout=900):
    """One fresh process: the row it measured (or a row with 'error')."""
    backend = BACKEND["name"]
    # (llvm: dynamic=False, the unrolled steps, which llvm compiles; see docs/jit.md)
    code = _CHILD.format(here=HERE, examples=os.path.join(os.path.dirname(HERE), "examples"),
                         kind=kind, steps=steps, timing=timing, backend=backend,
                         dynamic=False if backend == "llvm" else None)
    env = dict(os.environ, HYBRIDNET_CACHE_DIR=cache_dir, **(env_extra or {}))
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:120]}


def measure(kind, steps):
    """Cold then warm process on one fresh cache folder."""
    with tempfile.TemporaryDirectory() as cache_dir:
        cold = run_child(kind, steps, cache_dir, timing=False)
        warm = run_child(kind, steps, cache_dir, timing=True)
    return cold, warm


def _mb(v):
    return "-" if v is None else f"{v:.0f}"


def _t(v):
    return "-" if v is None else fmt_time(v)


def _x(v):
    return "-" if v is None else f"{v:.1f}x"


def table(title, rows):
    """Print one workload's rows."""
    print_table(title, rows, [
        ("size", "steps", str), ("kernels", "kernels (calls)", str),
        ("cold_compile", "cold compile", _t), ("cold_peak", "cold peak MB", _mb),
        ("warm_compile", "warm compile", _t), ("warm_peak", "warm peak MB", _mb),
        ("cold_warm", "cold/warm", _x), ("trace", "trace (1st call)", _t),
        ("eager", "eager/call", _t), ("per_call", "compiled/call", _t),
        ("speedup", "eager/compiled", _x), ("base", "RSS after import MB", _mb),
        ("note", "note", str)])


def row_of(steps, cold, warm):
    """Merge a cold and a warm measurement into one table row."""
    if "error" in cold or "error" in warm:
        return {"size": steps, "note": cold.get("error") or warm.get("error"),
                "kernels": "-"}
    note = "ok" if max(cold["err"], warm["err"]) < 1e-9 else f"max err {cold['err']:.1e}"
    if warm["disk_hits"] < warm["kernels"]:
        note += f"; warm loaded {warm['disk_hits']}/{warm['kernels']} from disk"
    return {"size": steps, "kernels": f"{cold['kernels']} ({cold['calls']})",
            "cold_compile": cold["compile"], "cold_peak": cold["peak"],
            "warm_compile": warm["compile"], "warm_peak": warm["peak"],
            "cold_warm": cold["compile"] / max(warm["compile"], 1e-9),
            "trace": cold["trace"], "eager": warm["eager"], "per_call": warm["per_call"],
            "speedup": warm["eager"] / warm["per_call"], "base": cold["base"], "note": note}


def unsplit_rows(kind, sizes, timeout):
    """The same workloads compiled as one function (no splitting), cold."""
    rows = []
    for steps in sizes:
        with tempfile.TemporaryDirectory() as cache_dir:
            r = run_child(kind, steps, cache_dir, timing=False, timeout=timeout,
                          env_extra={"HYBRIDNET_KERNEL_BUDGET": str(10 ** 9),
                                     "HYBRIDNET_KERNEL_CAP": str(10 ** 9)})
        rows.append({"size": steps, "kernels": "1", "cold_compile": r.get("compile"),
                     "cold_peak": r.get("peak"), "trace": r.get("trace"),
                     "base": r.get("base"), "note": r.get("error", "one function")})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two smallest sizes only")
    parser.add_argument("--unsplit", action="store_true",
                        help="also compile small sizes as one function (before splitting)")
    parser.add_argument("--backend", default="numba", choices=["numba", "llvm"],
                        help="llvm: the unrolled steps (dynamic=False) compiled by llvm")
    opts = parser.parse_args()
    BACKEND["name"] = opts.backend
    sizes = {"rnn": [16, 64, 256, 1024], "lstm": [20, 100, 199]}
    for kind, steps_list in sizes.items():
        steps_list = steps_list[:2] if opts.quick else steps_list
        rows = [row_of(steps, *measure(kind, steps)) for steps in steps_list]
        table(f"{kind}: compile time and peak memory, backend {opts.backend}", rows)
        if opts.unsplit:
            small = {"rnn": [16, 64], "lstm": [5, 10, 20]}[kind]
            table(f"{kind}: compiled as one function (no splitting), cold",
                  unsplit_rows(kind, small, timeout=240))


if __name__ == "__main__":
    main()
