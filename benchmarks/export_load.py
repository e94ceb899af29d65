"""Time to load and first-run an exported model (issue 11).

    python benchmarks/export_load.py [--repeat N] [--onnx]

Exports the W2 MLP (784-256-256-10, batch 64) to JSON once, then in fresh processes
(which have none of the model's Python code) measures: importing hybridnet, `hn.load`
(parse, validate, optimize, lower, compile), the first call, and the median call; with
an empty kernel cache (cold, a new machine) and with the cache the cold run left (warm).
Next to it: the same model built and traced in Python (`@hn.trace` first two calls),
eager calls, and onnxruntime on the ONNX export when installed (`--onnx`). Medians of
`--repeat` fresh processes per row.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _common import fmt_time, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MAKE = """
import hybridnet as hn, numpy as np
hn.manual_seed(0)
model = hn.nn.Sequential(hn.nn.Linear(784, 256), hn.nn.ReLU(), hn.nn.Linear(256, 256),
                         hn.nn.ReLU(), hn.nn.Linear(256, 10))
x = hn.randn(64, 784)
"""

EXPORT = MAKE + """
import sys
hn.export(model, x, path=sys.argv[1] + "/mlp.json")
np.save(sys.argv[1] + "/x.npy", x.numpy())
"""

LOADED = """
import time, json, sys
t0 = time.perf_counter()
import hybridnet as hn, numpy as np
t1 = time.perf_counter()
f = hn.load(sys.argv[1] + "/mlp.json")
t2 = time.perf_counter()
x = np.load(sys.argv[1] + "/x.npy")
f(x)
t3 = time.perf_counter()
calls = []
for _ in range(50):
    s = time.perf_counter(); f(x); calls.append(time.perf_counter() - s)
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first": t3 - t2,
                  "call": sorted(calls)[25]}))
"""

TRACED = """
import time, json, sys
t0 = time.perf_counter()
import hybridnet as hn
t1 = time.perf_counter()
""" + MAKE + """
fn = hn.trace(model)
t2 = time.perf_counter()
with hn.no_grad():
    fn(x); fn(x)
t3 = time.perf_counter()
calls, eager = [], []
with hn.no_grad():
    for _ in range(50):
        s = time.perf_counter(); fn(x); calls.append(time.perf_counter() - s)
    for _ in range(50):
        s = time.perf_counter(); model(x); eager.append(time.perf_counter() - s)
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first": t3 - t2,
                  "call": sorted(calls)[25], "eager": sorted(eager)[25]}))
"""

ORT = """
import time, json, sys
t0 = time.perf_counter()
import onnxruntime as ort, numpy as np
t1 = time.perf_counter()
s = ort.InferenceSession(sys.argv[1] + "/mlp.onnx", providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
x = np.load(sys.argv[1] + "/x.npy")
name = s.get_inputs()[0].name
s.run(None, {name: x})
t3 = time.perf_counter()
calls = []
for _ in range(50):
    a = time.perf_counter(); s.run(None, {name: x}); calls.append(time.perf_counter() - a)
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first": t3 - t2,
                  "call": sorted(calls)[25]}))
"""


def _run(code, folder, cache):
    env = {**os.environ, "PYTHONPATH": ROOT, "HYBRIDNET_CACHE_DIR": cache}
    proc = subprocess.run([sys.executable, "-c", code, folder], capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def _median(runs) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--onnx", action="store_true", help="also onnxruntime")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        _run(EXPORT, folder, os.path.join(folder, "c0"))
        cold, warm, traced_cold, traced_warm = [], [], [], []
        for k in range(args.repeat):
            cache = os.path.join(folder, f"cache{k}")
            cold.append(_run(LOADED, folder, cache))
            warm.append(_run(LOADED, folder, cache))
            tcache = os.path.join(folder, f"tcache{k}")
            traced_cold.append(_run(TRACED, folder, tcache))
            traced_warm.append(_run(TRACED, folder, tcache))
        rows.append({"impl": "hn.load, empty kernel cache", **_median(cold)})
        rows.append({"impl": "hn.load, warm kernel cache", **_median(warm)})
        tc, tw = _median(traced_cold), _median(traced_warm)
        rows.append({"impl": "model in Python, @hn.trace, empty cache", **tc})
        rows.append({"impl": "model in Python, @hn.trace, warm cache", **tw})
        rows.append({"impl": "model in Python, eager", "import": tw["import"],
                     "load": tw["load"], "first": float("nan"), "call": tw["eager"]})
        if args.onnx:
            _onnx_row(folder, rows, args.repeat)
    for r in rows:
        r["ready"] = r["load"] + (r["first"] if r["first"] == r["first"] else 0.0)
    base = rows[0]["call"]
    for r in rows:
        r["ratio"] = r["call"] / base
    print_table("Exported W2 MLP (784-256-256-10, batch 64, float32), fresh processes, "
                f"medians of {args.repeat}", rows,
                [("impl", "implementation", str), ("import", "import", fmt_time),
                 ("load", "load / build", fmt_time), ("first", "first call(s)", fmt_time),
                 ("ready", "load + first", fmt_time), ("call", "median call", fmt_time),
                 ("ratio", "call vs hn.load", lambda v: f"{v:.2f}x")])
    print("  (@hn.trace rows: 'first call(s)' is the first two calls: trace, then compile "
          "and run)")


def _onnx_row(folder, rows, repeat):
    code = MAKE + "\nimport sys\nopen(sys.argv[1] + '/mlp.onnx', 'wb').write(" \
        "hn.export(model, x, format='onnx'))\n"
    _run(code, folder, os.path.join(folder, "c1"))
    runs = [_run(ORT, folder, folder) for _ in range(repeat)]
    rows.append({"impl": "onnxruntime (CPU) on the ONNX export", **_median(runs)})


if __name__ == "__main__":
    main()
