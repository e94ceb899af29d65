"""compiler/thread_choice.py: a compiled kernel with large products runs them on BLAS's
threads or on one thread, whichever its own calls measured faster; it compares again
every EVERY calls, and the choice never changes a result."""

import ctypes

import numpy as np
import pytest

import hybridnet as hn
from compiler import blas, thread_choice
from compiler.thread_choice import EVERY, TRIAL, KernelChooser

SETTER = 12345


def _chooser():
    fns = np.array([7, SETTER, 2], dtype=np.uintp)
    return fns, KernelChooser(fns, 1)


def _drive(chooser, fns, seconds_of, calls):
    """`calls` calls; a timed one takes seconds_of(threaded). Returns the modes run."""
    modes = []
    for _ in range(calls):
        timed = chooser.start()
        threaded = bool(fns[1])
        modes.append(threaded)
        if timed:
            chooser.done(seconds_of(threaded))
    return modes


def test_the_faster_mode_is_chosen_and_the_other_is_tried_again_later():
    fns, ch = _chooser()
    busy = {True: 0.097, False: 0.068}  # (a language model's step next to a busy process)
    modes = _drive(ch, fns, busy.get, 1 + 2 * TRIAL)
    assert modes[0] is True  # (the first call warms up, untimed, on the size rule)
    assert modes[1:] == [True, False] * TRIAL  # (alternating)
    assert ch.threaded is False and fns[1] == 0 and ch.comparisons == 1
    assert ch.last == (0.097, 0.068)
    # EVERY calls on one thread, then a comparison again: the machine went quiet
    quiet = {True: 0.054, False: 0.066}
    modes = _drive(ch, fns, quiet.get, EVERY)
    assert modes == [False] * EVERY and ch.comparisons == 1
    modes = _drive(ch, fns, quiet.get, 2 * TRIAL + 1)
    assert modes[:2 * TRIAL] == [True, False] * TRIAL
    assert ch.threaded is True and fns[1] == SETTER and modes[-1] is True
    assert "on BLAS's threads" in ch.describe() and "54 ms threaded" in ch.describe()


def test_a_small_difference_keeps_the_mode():
    fns, ch = _chooser()
    even = {True: 0.100, False: 0.097}  # (within MARGIN: noise, not a reason to switch)
    _drive(ch, fns, even.get, 1 + 2 * TRIAL)
    assert ch.threaded is True and fns[1] == SETTER


def test_medians_ignore_one_outlier():
    fns, ch = _chooser()
    times = iter([0.050, 0.090, 0.050, 0.091, 5.0, 0.089])  # (threaded, one, ...)
    ch.start()  # (warm-up)
    for _ in range(2 * TRIAL):
        assert ch.start()
        ch.done(next(times))
    assert ch.threaded is True


def test_run_times_per_step_and_returns_the_result():
    fns, ch = _chooser()
    seen = []

    def kernel(x):
        seen.append(bool(fns[1]))
        return x + 1
    for _ in range(1 + 2 * TRIAL):
        assert ch.run(kernel, 1, per=10) == 2
    assert ch.comparisons == 1 and ch.last[0] < 1e-3  # (seconds per step: tiny)
    with pytest.raises(ZeroDivisionError):  # (an error inside still ends the timing)
        ch.run(lambda: 1 / 0)


def _kernel_of(traced):
    kernel = next(iter(traced.specializations.values())).traces[0].result.kernel
    return kernel.kernel() if callable(getattr(kernel, "kernel", None)) else kernel


@pytest.mark.usefixtures("two_threads")
def test_a_kernel_with_a_large_product_chooses_and_keeps_its_results(monkeypatch):
    """Through the kernel's function table: the setter is called around the large
    product in the threaded mode only, and both modes give the same answer."""
    monkeypatch.delenv("HYBRIDNET_BLAS_CHOICE", raising=False)

    def f(x, w, u):
        return (x @ w).tanh() @ u  # (4096*256*256 multiply-adds, then a small one)
    x, w, u = hn.randn(4096, 256), hn.randn(256, 256) * 0.05, hn.randn(256, 8)
    traced = hn.trace(f, backend="llvm")
    want = f(x, w, u).numpy()
    with hn.no_grad():
        traced(x, w, u)  # (traced)
        traced(x, w, u)  # (compiled: the kernel's first call, untimed)
        kernel = _kernel_of(traced)
        ch = kernel.threads_choice
        assert ch is not None and kernel.program.fns.index(blas.SET_THREADS) == ch._slot
        calls = []
        spy = ctypes.CFUNCTYPE(None, ctypes.c_int)(calls.append)
        ch.setter = ctypes.cast(spy, ctypes.c_void_p).value  # (what "threaded" writes)
        outs, per_call = [], []
        for _ in range(2 * TRIAL + 2):
            before = len(calls)
            outs.append(traced(x, w, u).numpy())
            per_call.append(calls[before:])
    # threaded and one thread alternate, then the faster one runs
    assert per_call[:2 * TRIAL] == [[2, 1], []] * TRIAL
    assert ch.comparisons == 1
    assert per_call[-1] == ([2, 1] if ch.threaded else [])
    for out in outs:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(outs[0], outs[1])  # (threads split rows, not sums)
    assert "BLAS threads: large products" in str(hn.explain(traced))


@pytest.mark.usefixtures("two_threads")
def test_a_kernel_of_small_products_only_does_not_time_its_calls(monkeypatch):
    """Exact sizes, every product below LARGE_MACS: the kernel never switches threads,
    so it gets no chooser (whose timing would cost every call a few µs for nothing);
    a loop's kernel for every length keeps one, a longer length may be large."""
    monkeypatch.delenv("HYBRIDNET_BLAS_CHOICE", raising=False)

    def f(x, w):
        return (x @ w).tanh() @ w.t()
    x, w = hn.randn(32, 64), hn.randn(64, 64)
    traced = hn.trace(f, backend="llvm")
    with hn.no_grad():
        for _ in range(3):
            np.testing.assert_allclose(traced(x, w).numpy(), f(x, w).numpy(), rtol=1e-5,
                                       atol=1e-5)
    kernel = _kernel_of(traced)
    assert kernel.program.uses_blas and not kernel.program.large_products
    assert kernel.threads_choice is None and not kernel.grows


def test_the_size_rule_alone_when_asked(monkeypatch):
    monkeypatch.setenv("HYBRIDNET_BLAS_CHOICE", "size")
    assert not thread_choice.choose_threads()
    monkeypatch.setenv("HYBRIDNET_BLAS_CHOICE", "")
    assert thread_choice.choose_threads()


@pytest.mark.usefixtures("two_threads")
def test_eager_large_products_choose_per_shape(monkeypatch):
    """Eager products of at least LARGE_MACS: one chooser per shape; in the threaded mode
    they run in SciPy's BLAS on its threads, else on one (blas._large_product)."""
    monkeypatch.delenv("HYBRIDNET_BLAS_CHOICE", raising=False)
    monkeypatch.setattr(thread_choice, "_EAGER", {})
    threaded = []
    original = blas._large_product

    def spy(wide, a, b):
        if wide:
            threaded.append(a.shape)
        return original(wide, a, b)
    monkeypatch.setattr(blas, "_large_product", spy)
    rng = np.random.default_rng(0)
    a = hn.tensor(rng.standard_normal((512, 512)).astype(np.float32))
    b = hn.tensor(rng.standard_normal((512, 256)).astype(np.float32))
    assert blas.macs(a.shape, b.shape) >= blas.LARGE_MACS
    want = a.numpy().astype(np.float64) @ b.numpy().astype(np.float64)
    modes = []
    for _ in range(1 + 2 * TRIAL):
        before = len(threaded)
        got = (a @ b).numpy()
        modes.append(len(threaded) > before)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert modes == [True] + [True, False] * TRIAL
    chooser = thread_choice.eager_chooser(a._data, b._data)
    assert chooser.comparisons == 1 and chooser.last is not None
    c = hn.tensor(rng.standard_normal((256, 512)).astype(np.float32))
    assert thread_choice.eager_chooser(c._data, a._data) is not chooser  # (its own)
    small = hn.randn(32, 64) @ hn.randn(64, 32)  # (below LARGE_MACS: no chooser)
    assert small.shape == (32, 32) and len(thread_choice._EAGER) == 2


@pytest.mark.usefixtures("two_threads")
def test_eager_size_rule_alone_when_asked(monkeypatch):
    monkeypatch.setenv("HYBRIDNET_BLAS_CHOICE", "size")
    monkeypatch.setattr(thread_choice, "_EAGER", {})
    calls = []
    original = blas._large_product
    monkeypatch.setattr(blas, "_large_product",
                        lambda wide, a, b: calls.append(wide) or original(wide, a, b))
    a, b = hn.randn(512, 512), hn.randn(512, 256)
    for _ in range(5):
        a @ b
    assert calls == [True] * 5 and not thread_choice._EAGER


def test_shapes_are_forgotten_past_the_limit(monkeypatch):
    monkeypatch.setattr(thread_choice, "_EAGER", {})
    monkeypatch.setattr(thread_choice, "MAX_SHAPES", 3)
    arrays = [np.empty((n, 2), np.float32) for n in range(1, 5)]
    first = thread_choice.eager_chooser(arrays[0], arrays[0].T)
    for x in arrays[1:3]:
        thread_choice.eager_chooser(x, x.T)
    assert thread_choice.eager_chooser(arrays[0], arrays[0].T) is first
    thread_choice.eager_chooser(arrays[3], arrays[3].T)  # (the fourth: forget, then add)
    assert len(thread_choice._EAGER) == 1
    assert thread_choice.eager_chooser(arrays[0], arrays[0].T) is not first
