"""Make `from oracles import ...` work and the repo importable however pytest is started."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

# Compiled kernels go to a fresh cache folder per test session, not ~/.cache; the folder
# is removed when the session ends (pytest_unconfigure below).
_OWN_CACHE = None
if "HYBRIDNET_CACHE_DIR" not in os.environ:
    import tempfile
    _OWN_CACHE = tempfile.mkdtemp(prefix="hybridnet-test-cache-")
    os.environ["HYBRIDNET_CACHE_DIR"] = _OWN_CACHE

# A failure making a loop's gradient a loop raises in the tests (users get the unrolled
# graph's gradient instead: compiler.gradient.split_gradient)
os.environ.setdefault("HYBRIDNET_LOOP_GRAD", "strict")

from compiler import blas  # noqa: E402  (after the path and the cache folder above)


@pytest.fixture
def two_threads():
    """As on a 2-core machine whatever this one is: large products get 2 threads (and
    choose by timing, compiler/thread_choice.py, unless a test says otherwise)."""
    saved = blas._wide[0]
    blas._wide[0] = 2
    yield
    blas._wide[0] = saved
    blas._set(1)


@pytest.fixture
def thread_settings(monkeypatch):
    """hn.set_num_threads's process-wide settings (its environment variables, Numba's
    thread count) as they were before the test, afterwards."""
    for key in ("HYBRIDNET_THREADS", "NUMBA_NUM_THREADS"):
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)
    numba = sys.modules.get("numba")
    count = numba.get_num_threads() if numba is not None else None
    yield
    if numba is not None:
        numba.set_num_threads(count)


@pytest.fixture
def in_block_spy(monkeypatch):
    """The llvm_loop._in_block answers of every loop lowered in the test (no kernel
    cache: a kernel another test compiled would be reused without lowering)."""
    import compiler.lowering.llvm_loop as llvm_loop
    import runtime.pipeline as pipeline
    from runtime.cache import KernelCache
    monkeypatch.setenv("HYBRIDNET_CACHE", "0")
    monkeypatch.setattr(pipeline, "_KERNELS", KernelCache())
    found = []
    real = llvm_loop._in_block

    def recording(*args):
        out = real(*args)
        found.append(out)
        return out
    monkeypatch.setattr(llvm_loop, "_in_block", recording)
    return found


def pytest_unconfigure(config):
    """Remove this session's kernel cache folder (about 160 MB after a full run)."""
    if _OWN_CACHE is not None:
        import shutil
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    """After twin-state tests ran (tests/test_state_twins.py): how many traced calls ran
    compiled, and why the others ran eagerly."""
    twins = sys.modules.get("twins")
    if twins is not None and getattr(twins, "RESULTS", None):
        terminalreporter.section("hn.trace twin-state summary")
        terminalreporter.write_line(twins.format_summary())
