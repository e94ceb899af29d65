"""Long traces compile in bounded time and memory: loops, split kernels, disk cache.

The unrolled two-LSTMCell model (PyTorch's time_sequence_prediction) used to be one
Numba function: 115 s to compile over 20 steps, over 24 GB at 199. Its steps are now
rerolled into one loop (compiler.reroll) whose body compiles once; long graphs without
repeats are split into bounded kernels. The subprocess limits below are hang guards,
not timing assertions.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

import hybridnet as hn
from compiler.lowering import chunking

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG_GUARD_SECONDS = 300
PEAK_RSS_LIMIT_MB = 2048

_LSTM = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import hybridnet as hn
    sys.path.insert(0, {examples!r})
    from time_sequence import Sequence, sine_wave

    def peak_mb():
        # this process's own peak (VmHWM): ru_maxrss keeps the peak of the process it
        # was forked from (a big test runner) across exec
        try:
            with open("/proc/self/status") as f:
                line = next(ln for ln in f if ln.startswith("VmHWM:"))
            return int(line.split()[1]) / 1024
        except (OSError, StopIteration):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    rows = []
    for steps in map(int, sys.argv[1:]):
        hn.manual_seed(steps)
        model = Sequence()
        x = sine_wave(steps)
        traced = hn.trace(model)
        with hn.no_grad():
            expected = model(x).numpy()
            first = traced(x).numpy()
            second = traced(x).numpy()
            third = traced(x).numpy()
        result = next(iter(traced.specializations.values())).traces[0].result
        kernel = result.kernel
        parts = getattr(kernel, "parts", [kernel])
        rows.append(dict(
            steps=steps, shape=list(second.shape),
            eager_ok=bool(np.array_equal(first, expected)),
            compiled_ok=bool(np.allclose(second, expected, rtol=1e-10, atol=1e-12) and
                             np.allclose(third, expected, rtol=1e-10, atol=1e-12)),
            compiled_calls=traced.stats.compiled_calls, fallbacks=traced.stats.fallbacks,
            kernels=len(parts), calls=kernel.source.count(" = c"),
            loops=sum(n.op == "loop" for n in result.optimized.nodes),
            compile_s=traced.stats.compile_seconds,
            disk_hits=sum(p.cache_hits for p in parts),
            peak_mb=peak_mb()))
    print("ROWS " + json.dumps(rows))
""").format(examples=os.path.join(ROOT, "examples"))


def _rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _guarded(cmd, env):
    """Run cmd; kill it past HANG_GUARD_SECONDS or PEAK_RSS_LIMIT_MB (checked from here, so
    a compile that blows up fails the test instead of exhausting the machine)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        start = time.monotonic()
        while proc.poll() is None:
            rss = _rss_mb(proc.pid)
            late = time.monotonic() - start > HANG_GUARD_SECONDS
            if late or rss > PEAK_RSS_LIMIT_MB:
                proc.kill()
                proc.wait()
                pytest.fail(f"killed: {'hang guard' if late else f'RSS {rss:.0f} MB'}")
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        assert proc.returncode == 0, err.read()[-3000:]
        return out.read()


def _lstm_rows(cache_dir, *steps):
    env = dict(os.environ, HYBRIDNET_CACHE_DIR=str(cache_dir), PYTHONPATH=ROOT)
    for name in ("HYBRIDNET_KERNEL_BUDGET", "HYBRIDNET_KERNEL_CAP", "HYBRIDNET_CACHE"):
        env.pop(name, None)
    out = _guarded([sys.executable, "-c", _LSTM, *map(str, steps)], env)
    line = next(ln for ln in out.splitlines() if ln.startswith("ROWS "))
    return json.loads(line[5:])


@pytest.fixture(scope="module")
def lstm_cold(tmp_path_factory):
    """One fresh process, empty kernel cache: 199 steps first, then 100 and 20."""
    cache = tmp_path_factory.mktemp("lstm-kernels")
    return cache, _lstm_rows(cache, 199, 100, 20)


def test_unrolled_lstm_compiles_in_bounded_time_and_memory(lstm_cold):
    _, rows = lstm_cold
    for row in rows:
        assert row["shape"] == [10, row["steps"]]
        assert row["eager_ok"] and row["compiled_ok"], row
        assert row["compiled_calls"] == 2 and row["fallbacks"] == 0, row
        assert row["peak_mb"] < PEAK_RSS_LIMIT_MB, row
    for row in rows:  # the steps are one loop whose body compiles once
        assert row["loops"] == 1 and row["kernels"] == 1, row


def test_a_second_process_loads_split_kernels_from_disk(lstm_cold):
    cache, _ = lstm_cold
    (row,) = _lstm_rows(cache, 199)
    assert row["compiled_ok"] and row["fallbacks"] == 0, row
    assert row["disk_hits"] == row["kernels"] == 1, row  # loaded, not compiled


# ---- in-process: split vs one kernel vs eager --------------------------------------------


def _medium(x, w, s):
    """Matmuls with a transposed weight, softmax rows, slices, small and big cats,
    leading-dim sums, a 0-d input and several outputs."""
    h, rows = x, []
    for k in range(10):
        a = (h @ w.T) * s + 0.1 * k
        a = hn.softmax(a, 1) if k % 2 else a.tanh()
        g1, g2 = hn.chunk(a, 2, 1)
        h = hn.cat([g1 * 2.0, g2.relu()], 1) + h
        rows.append(h.sum(0, keepdim=True))
    return hn.cat(rows, 0), h.mean(), (h - h.mean(1, keepdim=True)).abs().sum(1)


def _inputs(batch):
    rng = np.random.default_rng(batch)
    return (hn.tensor(rng.standard_normal((batch, 12))),
            hn.tensor(rng.standard_normal((12, 12)) * 0.3), hn.tensor(np.float64(0.7)))


def _compiled(fn, args):
    traced = hn.trace(fn, backend="numba")
    with hn.no_grad():
        traced(*args)
        out = [t.numpy() for t in traced(*args)]
    assert traced.stats.compiled_calls == 1, traced.stats.events
    return traced, out


def test_a_split_program_matches_one_kernel_and_eager(monkeypatch):
    args = _inputs(6)
    with hn.no_grad():
        expected = [t.numpy() for t in _medium(*args)]
    monkeypatch.setenv("HYBRIDNET_KERNEL_BUDGET", "100000")  # one Numba function
    whole, one = _compiled(_medium, args)
    assert whole.source.startswith("def entry(")
    monkeypatch.setenv("HYBRIDNET_KERNEL_BUDGET", "16")
    split, parts = _compiled(_medium, args)
    assert split.source.startswith("# split program") and "def chunk(" in split.source
    kernel = next(iter(split.specializations.values())).traces[0].result.kernel
    assert len(kernel.parts) > 4 and "define" in split.llvm_ir
    assert "np.concatenate" in kernel.program.driver  # the 10-array cat runs in NumPy
    for a, b, e in zip(parts, one, expected):
        assert a.shape == b.shape == e.shape
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-14)
    other = _inputs(3)  # another batch size: still right
    with hn.no_grad():
        for a, e in zip(split(*other), _medium(*other)):
            np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-12, atol=1e-14)


def test_a_graph_over_the_cap_runs_eagerly_with_the_reason(monkeypatch):
    monkeypatch.setenv("HYBRIDNET_KERNEL_BUDGET", "16")
    monkeypatch.setenv("HYBRIDNET_KERNEL_CAP", "60")
    args = _inputs(4)
    traced = hn.trace(_medium, backend="numba")
    with hn.no_grad():
        expected = [t.numpy() for t in _medium(*args)]
        for _ in range(3):
            for a, e in zip(traced(*args), expected):
                np.testing.assert_array_equal(a.numpy(), e)
    assert traced.stats.compiled_calls == 0 and traced.stats.fallbacks == 1
    reasons = [e["detail"] for e in traced.stats.events if e["kind"] == "fallback"]
    assert any("too large to compile" in r and "HYBRIDNET_KERNEL_CAP" in r for r in reasons)


def test_cuts_repeat_with_the_period_of_an_unrolled_loop():
    sigs = [90, 91] + [1, 2, 3, 4] * 40 + [92]
    costs = [5] * len(sigs)
    ranges = chunking.plan(costs, sigs, budget=60)
    assert max(sum(costs[a:b]) for a, b in ranges) <= 60
    pieces = {tuple(sigs[a:b]) for a, b in ranges}
    assert len(pieces) <= 5, ranges  # prologue, shared periods, leftovers, epilogue
    assert chunking.best_period(sigs) == (4, 2, 40)
