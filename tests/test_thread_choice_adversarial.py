"""Adversarial review of compiler/thread_choice.py (large products choose BLAS's threads or
one thread by timing their own calls): results, dtypes, shapes, gradients and state must
never depend on the mode chosen, and nothing may crash, hang or raise where it did not.

Modes are forced either through a fake clock in compiler.thread_choice (a timed call
"takes" what its mode costs, so the comparison picks the cheaper mode) or by putting a
chooser in a mode as a finished comparison would (`_force`).
"""

import inspect
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time as _time
import types

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn as nn
import hybridnet.nn.functional as F
from compiler import blas, thread_choice
from compiler.thread_choice import TRIAL, ThreadChooser
from hybridnet.cli_bench import training_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TAGS = itertools.count(1)


# ---- helpers ------------------------------------------------------------------------------


@pytest.fixture
def two_threads(two_threads, monkeypatch):
    """Choosing on (as on a 2-core machine: conftest's), a fresh table of eager
    choosers."""
    monkeypatch.delenv("HYBRIDNET_BLAS_CHOICE", raising=False)
    monkeypatch.setattr(thread_choice, "_EAGER", {})
    yield


class ModeClock:
    """thread_choice's clock: a timed call takes `threaded` or `one` seconds, by the mode
    its chooser set (other callers get the real clock)."""

    def __init__(self, threaded, one):
        self.cost = {True: threaded, False: one}
        self.now = 0.0
        self.lock = threading.Lock()

    def perf_counter(self):
        chooser = sys._getframe(1).f_locals.get("self")
        if not isinstance(chooser, ThreadChooser):
            return _time.perf_counter()
        with self.lock:
            self.now += self.cost[bool(chooser.current)]
            return self.now


class ScaledClock:
    """The real clock, running `slower` times faster while a call is on one thread: the
    one-thread mode looks `slower` times slower than it is (it never changes inside a
    call)."""

    def __init__(self, slower):
        self.slower = slower

    def perf_counter(self):
        chooser = sys._getframe(1).f_locals.get("self")
        scale = 1.0
        if isinstance(chooser, ThreadChooser) and not chooser.current:
            scale = self.slower
        return _time.perf_counter() * scale


def _use_clock(monkeypatch, clock):
    monkeypatch.setattr(thread_choice, "time",
                        types.SimpleNamespace(perf_counter=clock.perf_counter))


def _force(chooser, threaded):
    """The chooser in `threaded` mode as a comparison that just chose it leaves it (the
    next EVERY calls run in it, untimed)."""
    chooser.threaded = threaded
    chooser._set(threaded)
    chooser.comparisons = max(chooser.comparisons, 1)
    chooser._trial, chooser._calls = -1, 0


def _unwrap(kernel):
    return kernel.kernel() if callable(getattr(kernel, "kernel", None)) else kernel


def _kernel_of(traced):
    return _unwrap(next(iter(traced.specializations.values())).traces[-1].result.kernel)


def _kernels_of(traced):
    """Every kernel (forward, then backward) of every trace of `traced`."""
    out = []
    for entry in traced.specializations.values():
        for tr in entry.traces:
            res = tr.result
            for k in (res.kernel, getattr(getattr(res, "backward", None), "kernel", None)):
                if k is not None:
                    out.append(_unwrap(k))
    return out


def _fn(tag=None):
    """(x @ w).tanh() @ u plus a constant of its own: a program (and kernel, chooser) of
    its own per test."""
    tag = next(_TAGS) if tag is None else tag
    return lambda x, w, u: (x @ w).tanh() @ u + float(tag) * 1e-3


def _arrays(seed, m=4096, k=256, n=256, order="C"):
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.standard_normal((m, k)).astype(np.float32), order=order)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    u = rng.standard_normal((n, 8)).astype(np.float32)
    return x, w, u



def _llvm_case(seed, *sizes, **kw):
    """_fn traced with the llvm backend on _arrays(seed, ...): (traced, f, the arrays as
    tensors, the arrays, f's tag)."""
    tag = next(_TAGS)
    f = _fn(tag)
    arrays = _arrays(seed, *sizes, **kw)
    return hn.trace(f, backend="llvm"), f, [hn.tensor(a) for a in arrays], arrays, tag

def _ref(x, w, u, tag):
    x, w, u = (a.astype(np.float64) for a in (x, w, u))
    return np.tanh(x @ w) @ u + float(tag) * 1e-3


def _modes_spy(monkeypatch):
    """Record whether each eager large product ran threaded (blas._large_product)."""
    seen = []
    original = blas._large_product

    def spy(wide, a, b):
        if wide:
            seen.append(True)
        return original(wide, a, b)
    monkeypatch.setattr(blas, "_large_product", spy)
    return seen


# ---- eager products ---------------------------------------------------------------------


@pytest.mark.parametrize("a_shape, b_shape", [((128, 1000), (1000, 800)),
                                              ((3, 128, 1000), (1000, 800))],
                         ids=["2d", "batched"])
def test_eager_large_product_bits_do_not_depend_on_the_mode(two_threads, monkeypatch,
                                                            a_shape, b_shape):
    """A comparison runs the product threaded and on one thread in turns: every result
    must be the same array (the program's values may not depend on machine load)."""
    _use_clock(monkeypatch, ModeClock(threaded=0.001, one=0.002))
    seen = _modes_spy(monkeypatch)
    rng = np.random.default_rng(1)
    a = hn.tensor(rng.standard_normal(a_shape).astype(np.float32))
    b = hn.tensor(rng.standard_normal(b_shape).astype(np.float32))
    want = a.numpy().astype(np.float64) @ b.numpy().astype(np.float64)
    outs, modes = [], []
    for _ in range(1 + 2 * TRIAL):
        before = len(seen)
        outs.append((a @ b).numpy())
        modes.append(len(seen) > before)
    assert modes == [True] + [True, False] * TRIAL  # (warm-up, then in turns)
    for out in outs:
        assert out.dtype == np.float32 and out.shape == want.shape
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-3)
    # BLAS on one thread and on several may round differently (an ulp, for some shapes):
    # within tolerance above; the same bits every call under use_deterministic_algorithms
    hn.use_deterministic_algorithms(True)
    try:
        same = [(a @ b).numpy() for _ in range(1 + 2 * TRIAL)]
    finally:
        hn.use_deterministic_algorithms(False)
    for out in same[1:]:
        np.testing.assert_array_equal(out, same[0])
    np.testing.assert_array_equal(same[0], outs[0])  # (threaded, as the warm-up was)


def _unaligned(a):
    buf = np.zeros(a.nbytes + 1, np.uint8)
    out = np.frombuffer(buf.data, np.uint8)[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


def _cases():
    rng = np.random.default_rng(2)

    def r(*shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)
    a, b = r(128, 1000), r(1000, 800)
    ro_a = a.copy()
    ro_a.flags.writeable = False
    return {
        "c": (a, b),
        "a_fortran": (np.asfortranarray(a), b),
        "b_fortran": (a, np.asfortranarray(b)),
        "a_transposed_view": (r(1000, 128).T, b),
        "b_transposed_view": (a, r(800, 1000).T),
        "a_strided": (r(128, 2000)[:, ::2], b),
        "a_reversed": (a[::-1], b),
        "b_broadcast_rows": (a, np.broadcast_to(r(1, 800), (1000, 800))),
        "a_unaligned": (_unaligned(a), b),
        "a_readonly": (ro_a, b),
        "float64": (a.astype(np.float64), b.astype(np.float64)),
        "f32_f64": (a, b.astype(np.float64)),
        "f64_f32": (a.astype(np.float64), b),
        "batched_2d_b": (r(2, 128, 1000), b),
        "batched_both": (r(2, 128, 1000), r(2, 1000, 800)),
        "batched_transposed": (r(2, 1000, 128).transpose(0, 2, 1), b),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_products_in_each_mode_match_float64(two_threads, monkeypatch, name):
    """blas.matmul with the product's chooser forced to each mode: the value (float32
    tolerance), dtype and shape of NumPy's own product, operands untouched."""
    a, b = CASES[name]
    a_before, b_before = a.copy(), b.copy()
    seen = _modes_spy(monkeypatch)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    plain = np.matmul(a, b)
    tol = (1e-10, 1e-9) if plain.dtype == np.float64 and a.dtype == b.dtype else (1e-4, 2e-3)
    for threaded in (True, False, True):
        _force(thread_choice.eager_chooser(a, b), threaded)
        before = len(seen)
        got = blas.matmul(a, b)
        assert (len(seen) > before) is threaded
        assert got.dtype == plain.dtype and got.shape == plain.shape
        np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[1])
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


@pytest.mark.parametrize("choice", ["", "size"])
@pytest.mark.parametrize("rows", [999, 1001])
def test_a_large_product_of_mismatched_shapes_raises_in_every_mode(two_threads, monkeypatch,
                                                                   choice, rows):
    """(128, 1000) @ (rows, 800): NumPy's error, whichever mode the product's chooser is
    in. (b is a view of a 1001-row array: a read past its end stays in the buffer.)"""
    monkeypatch.setenv("HYBRIDNET_BLAS_CHOICE", choice)
    rng = np.random.default_rng(3)
    a = hn.tensor(rng.standard_normal((128, 1000)).astype(np.float32))
    b = hn.tensor(rng.standard_normal((1001, 800)).astype(np.float32))[:rows]
    assert b.shape == (rows, 800)
    returned = []
    for _ in range(1 + 2 * TRIAL):
        try:
            returned.append((a @ b).shape)
        except Exception as exc:  # noqa: BLE001
            assert "cannot be multiplied" in str(exc) or "mismatch" in str(exc), exc
    assert returned == [], f"{len(returned)} of {1 + 2 * TRIAL} products returned {returned}"


def test_many_product_shapes_stay_bounded_and_right(two_threads):
    """More than MAX_SHAPES large shapes, a hot one in between (its chooser forgotten
    mid-comparison): every product right, the table never past the bound."""
    rng = np.random.default_rng(4)
    big = rng.standard_normal((400 + thread_choice.MAX_SHAPES + 4, 512)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    assert blas.macs((400, 512), b.shape) >= blas.LARGE_MACS
    hot = big[:400]
    hot_want = hot @ b
    for i, m in enumerate(range(401, 400 + thread_choice.MAX_SHAPES + 4)):
        a = big[:m]
        got = blas.matmul(a, b)
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
        assert len(thread_choice._EAGER) <= thread_choice.MAX_SHAPES
        if i % 37 == 0:
            np.testing.assert_allclose(blas.matmul(hot, b), hot_want, rtol=1e-5, atol=1e-4)
    for _ in range(1 + 2 * TRIAL):
        np.testing.assert_allclose(blas.matmul(hot, b), hot_want, rtol=1e-5, atol=1e-4)
    assert thread_choice.eager_chooser(hot, b).comparisons >= 1


def test_eager_products_from_several_threads_while_comparing(two_threads, monkeypatch):
    monkeypatch.setattr(thread_choice, "EVERY", 2)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((512, 512)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    want = a.astype(np.float64) @ b
    results, errors = [], []
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        for _ in range(15):
            try:
                results.append(blas.matmul(a, b))
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    assert len(results) == 60
    for got in results:  # (either mode: an ulp of round-off apart at most)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert thread_choice.eager_chooser(a, b).comparisons >= 1


# ---- the chooser itself ------------------------------------------------------------------


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    return None


def test_two_threads_ending_one_comparison_at_once_do_not_raise():
    """Two kernel calls finish at once at the end of a comparison whose turns threads
    mixed (lost `_trial += 1` updates; 12aaec0 restarts such a comparison). One thread
    restarts it (empty lists) while the other, which saw both sides filled, takes the
    medians: its done() must not raise out of the kernel call. The interleaving is
    forced with a line tracer; it also happens unforced (8 threads calling run() with
    EVERY = 0 and a 1 us switch interval: 5 IndexErrors in 240000 calls)."""
    ch = ThreadChooser()
    ch._trial = 2 * TRIAL
    ch._times = ([], [0.01] * (2 * TRIAL))
    reset = _line_of(ThreadChooser.done, "self._trial, self._times = 0,")
    median = _line_of(ThreadChooser.done, "one, wide =")
    a_at_reset, c_at_median, a_returned = (threading.Event() for _ in range(3))
    errors = {}

    def tracer(name):
        def local(frame, event, arg):
            if event == "line":
                if name == "A" and frame.f_lineno == reset:
                    a_at_reset.set()
                    c_at_median.wait(2)
                elif name == "C" and frame.f_lineno == median:
                    c_at_median.set()
                    a_returned.wait(2)
            return local

        def start(frame, event, arg):
            return local if frame.f_code is ThreadChooser.done.__code__ else None
        return start

    def worker(name, seconds):
        sys.settrace(tracer(name))
        try:
            ch.done(seconds)
        except Exception as exc:  # noqa: BLE001
            errors[name] = exc
        finally:
            sys.settrace(None)
            if name == "A":
                a_returned.set()
    first = threading.Thread(target=worker, args=("A", 0.01))
    first.start()
    a_at_reset.wait(5)
    second = threading.Thread(target=worker, args=("C", 0.02))
    second.start()
    first.join(10)
    second.join(10)
    assert not first.is_alive() and not second.is_alive()
    assert not errors, errors


def test_ending_a_comparison_writes_the_chosen_mode_and_describes_it():
    fns = np.array([1, 777, 2], dtype=np.uintp)
    ch = thread_choice.KernelChooser(fns, 1)
    assert ch.start() is False and int(fns[1]) == 777  # (warm-up, on the size rule)
    for times, threaded in (((0.010, 0.002), False), ((0.001, 0.004), True),
                            ((0.0100, 0.0097), True)):
        if ch.comparisons:
            assert ch._trial == -1
            ch._calls = thread_choice.EVERY  # (the next call compares again)
        for i in range(2 * TRIAL):
            assert ch.start() is True
            assert bool(fns[1]) is (i % 2 == 0) and fns[1] in (0, 777)
            ch.done(times[0] if fns[1] else times[1])
        assert ch.threaded is threaded and int(fns[1]) == (777 if threaded else 0)
        assert ("on BLAS's threads" if threaded else "on one thread") in ch.describe()
    assert ch.comparisons == 3 and ch.setter == 777


# ---- compiled kernels ---------------------------------------------------------------------


@pytest.mark.parametrize("m, k, n", [(4096, 256, 256), (128, 1000, 800)])
def test_compiled_kernel_bits_do_not_depend_on_the_mode(two_threads, monkeypatch, m, k, n):
    """docs/architecture.md: "the machine code is the same either way and a result never
    depends on it". Every call of a comparison (threaded and one thread in turns) must
    give the same array, and equal eager's value within float32 tolerance."""
    _use_clock(monkeypatch, ModeClock(threaded=0.001, one=0.002))
    traced, f, xs, (x, w, u), tag = _llvm_case(6, m, k, n)
    want = _ref(x, w, u, tag)
    with hn.no_grad():
        eager = f(*xs).numpy()
        outs = [traced(*xs).numpy() for _ in range(2 + 2 * TRIAL)]
    ch = _kernel_of(traced).threads_choice
    assert ch is not None and ch.comparisons == 1 and ch.threaded is True
    for out in outs + [eager]:
        assert out.dtype == np.float32 and out.shape == (m, 8)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    # (one thread and BLAS's threads may round differently: within tolerance above; under
    # use_deterministic_algorithms every call gives the threaded call's bits)
    hn.use_deterministic_algorithms(True)
    try:
        with hn.no_grad():
            same = [traced(*xs).numpy() for _ in range(2 * TRIAL)]
    finally:
        hn.use_deterministic_algorithms(False)
    for out in same:
        np.testing.assert_array_equal(out, outs[2])


@pytest.mark.parametrize("order", ["C", "F"])
def test_the_faster_mode_is_chosen_whatever_the_inputs_layout(two_threads, monkeypatch,
                                                              order):
    """One thread made to look 10x slower than it is: the comparison must choose BLAS's
    threads. With a Fortran-ordered input every call is timed twice: the fast path
    (hn_call) rejects the layout in microseconds and that rejection is timed as a call
    of the mode, then the converting path runs and is timed as the next turn."""
    _use_clock(monkeypatch, ScaledClock(slower=10.0))
    traced, f, xs, (x, w, u), tag = _llvm_case(7, 1000, 512, 256, order=order)
    assert xs[0]._data.flags.c_contiguous is (order == "C")
    want = _ref(x, w, u, tag)
    with hn.no_grad():
        for _ in range(3 + 2 * TRIAL):
            np.testing.assert_allclose(traced(*xs).numpy(), want, rtol=1e-4, atol=1e-3)
    ch = _kernel_of(traced).threads_choice
    assert ch.comparisons >= 1
    wide, one = ch.last
    assert ch.threaded is True and one > wide, \
        f"chose {'threads' if ch.threaded else 'one thread'}: medians threaded " \
        f"{wide * 1e3:.3g} ms, one thread {one * 1e3:.3g} ms"


def test_a_call_the_kernel_rejects_is_not_a_timed_turn(two_threads):
    """A wrong-shaped input raises the ValueError it always did, and leaves the running
    comparison as it was (it ran no product: its microseconds are no sample of a mode)."""
    traced, f, xs, (x, w, u), tag = _llvm_case(8)
    with hn.no_grad():
        traced(*xs)
        traced(*xs)  # (the kernel's first call: warm-up)
        traced(*xs)  # (the comparison's first turn)
    k = _kernel_of(traced)
    ch = k.threads_choice
    assert ch._trial == 1
    before = (ch._trial, [list(t) for t in ch._times])
    with pytest.raises(ValueError, match="compiled kernel"):
        k(x[:100], w, u)
    assert (ch._trial, [list(t) for t in ch._times]) == before


def test_errors_in_the_middle_of_a_comparison_leave_the_kernel_working(two_threads,
                                                                       monkeypatch):
    _use_clock(monkeypatch, ModeClock(threaded=0.002, one=0.001))
    traced, f, xs, (x, w, u), tag = _llvm_case(9)
    with hn.no_grad():
        want = traced(*xs).numpy()
        traced(*xs)
        k = _kernel_of(traced)
        ch = k.threads_choice
        slot = ch._slot
        for _ in range(2 * TRIAL + 4):
            with pytest.raises(ValueError, match="compiled kernel"):
                k(x[:, :100].copy(), w, u)
            with pytest.raises(TypeError, match="inputs"):
                k(x, w)
            with pytest.raises(ValueError):
                k(x.astype(np.float64), w, u)
            got = traced(*xs).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            direct = k(x, w, u)
            np.testing.assert_allclose(direct, want, rtol=1e-5, atol=1e-5)
    assert ch.comparisons >= 1 and ch._trial < 0
    assert int(k._fns[slot]) == (ch.setter if ch.threaded else 0) and ch.setter != 0


def test_kernel_called_from_several_threads_while_comparing(two_threads, monkeypatch):
    monkeypatch.setattr(thread_choice, "EVERY", 2)
    traced, f, xs, (x, w, u), tag = _llvm_case(10)
    with hn.no_grad():
        traced(*xs)
        want = traced(*xs).numpy()
    k = _kernel_of(traced)
    ch = k.threads_choice
    results, errors = [], []
    barrier = threading.Barrier(4)

    def work(i):
        barrier.wait()
        for j in range(12):
            try:
                arrays = (x, w, u) if (i + j) % 3 else (np.asfortranarray(x), w, u)
                results.append(k(*arrays))
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    assert len(results) == 48 and ch.comparisons >= 2
    for got in results:
        np.testing.assert_array_equal(got, want)
    with hn.no_grad():  # (and on, single-threaded)
        np.testing.assert_array_equal(traced(*xs).numpy(), want)


def test_set_num_threads_one_keeps_compiled_products_on_one_thread(two_threads,
                                                                    thread_settings):
    """hn.set_num_threads(1): "large matrix products run on n BLAS threads". A kernel
    compiled before must then not raise OpenBLAS to 2 threads around its large products;
    after set_num_threads(2) again results are unchanged."""
    import ctypes
    traced, f, xs, (x, w, u), tag = _llvm_case(11)
    with hn.no_grad():
        traced(*xs)
        want = traced(*xs).numpy()
    ch = _kernel_of(traced).threads_choice
    calls = []
    spy = ctypes.CFUNCTYPE(None, ctypes.c_int)(calls.append)
    real_setter = ch.setter
    ch.setter = ctypes.cast(spy, ctypes.c_void_p).value
    try:
        _force(ch, True)
        hn.set_num_threads(1)
        with hn.no_grad():
            for _ in range(2 + 2 * TRIAL):
                np.testing.assert_array_equal(traced(*xs).numpy(), want)
        raised = [n for n in calls if n > 1]
        hn.set_num_threads(2)
        with hn.no_grad():
            for _ in range(2 + 2 * TRIAL):
                np.testing.assert_array_equal(traced(*xs).numpy(), want)
    finally:
        ch.setter = real_setter
        ch._set(ch.current)
    assert raised == [], f"after set_num_threads(1) the kernel set {len(raised)} products " \
                         f"to {sorted(set(raised))} BLAS threads"


def test_a_forked_child_after_a_comparison_computes_the_same(two_threads, monkeypatch):
    _use_clock(monkeypatch, ModeClock(threaded=0.001, one=0.002))
    traced, f, xs, (x, w, u), tag = _llvm_case(12)
    rng = np.random.default_rng(12)
    ea = rng.standard_normal((512, 512)).astype(np.float32)
    eb = rng.standard_normal((512, 256)).astype(np.float32)
    with hn.no_grad():
        for _ in range(2 + 2 * TRIAL):
            want = traced(*xs).numpy()
        eager_want = [blas.matmul(ea, eb) for _ in range(1 + 2 * TRIAL)][-1]
    ch = _kernel_of(traced).threads_choice
    assert ch.comparisons == 1 and ch.threaded is True
    for threaded in (True, False):
        _force(ch, threaded)
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # (the child: report and leave, never back into pytest)
            code = 3
            try:
                os.close(r)
                with hn.no_grad():
                    outs = [traced(*xs).numpy() for _ in range(2 + 2 * TRIAL)]
                    eager = [blas.matmul(ea, eb) for _ in range(2 + 2 * TRIAL)]
                same = all(np.array_equal(o, want) for o in outs) and \
                    all(np.array_equal(o, eager_want) for o in eager)
                os.write(wfd, b"same" if same else b"differ")
                code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        ready, _, _ = select.select([r], [], [], 120)
        message = os.read(r, 16) if ready else b"(timeout)"
        os.close(r)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert message == b"same" and os.waitstatus_to_exitcode(status) == 0, \
            (threaded, message, status)
        with hn.no_grad():  # (the parent goes on)
            np.testing.assert_array_equal(traced(*xs).numpy(), want)


_CHILD = r"""
import hashlib, json
import numpy as np, hybridnet as hn
from compiler import blas
blas._wide[0] = 2
rng = np.random.default_rng(13)
x = hn.tensor(rng.standard_normal((4096, 256)).astype(np.float32))
w = hn.tensor((rng.standard_normal((256, 256)) * 0.05).astype(np.float32))
u = hn.tensor(rng.standard_normal((256, 8)).astype(np.float32))
def f(x, w, u):
    return (x @ w).tanh() @ u + 0.123
traced = hn.trace(f, backend="llvm")
h, e = hashlib.sha256(), hashlib.sha256()
with hn.no_grad():
    for _ in range(10):
        h.update(traced(x, w, u).numpy().tobytes())
        e.update((x @ w).numpy().tobytes())
k = next(iter(traced.specializations.values())).traces[-1].result.kernel
k = k.kernel() if callable(getattr(k, "kernel", None)) else k
ch = k.threads_choice
print(json.dumps({"from_disk": bool(k.from_disk), "chooser": ch is not None,
                  "comparisons": ch.comparisons if ch else 0, "traced": h.hexdigest(),
                  "eager": e.hexdigest()}))
"""


def test_disk_cached_kernels_and_the_size_rule_give_the_same_results(tmp_path):
    env = dict(os.environ, HYBRIDNET_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    env.pop("HYBRIDNET_BACKEND", None)
    env.pop("HYBRIDNET_BLAS_THREADS", None)

    def child(choice):
        env["HYBRIDNET_BLAS_CHOICE"] = choice
        out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                             env=env, timeout=300, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])
    first, second, size = child(""), child(""), child("size")
    assert (first["from_disk"], second["from_disk"], size["from_disk"]) == (False, True, True)
    assert first["chooser"] and second["chooser"] and not size["chooser"]
    assert first["comparisons"] == second["comparisons"] == 1
    assert first["traced"] == second["traced"] == size["traced"]
    assert first["eager"] == second["eager"] == size["eager"]


def test_explain_reports_the_choice_and_the_last_comparison(two_threads, monkeypatch):
    _use_clock(monkeypatch, ModeClock(threaded=0.002, one=0.001))
    traced, f, xs, (x, w, u), tag = _llvm_case(14)
    with hn.no_grad():
        traced(*xs)  # (traced and compiled)
        traced(*xs)  # (warm-up)
        text = str(hn.explain(traced))
        assert "BLAS threads: large products on BLAS's threads (not compared yet)" in text
        for _ in range(2 * TRIAL):
            traced(*xs)
    text = str(hn.explain(traced))
    assert "BLAS threads: large products on one thread: last comparison 2 ms threaded, " \
           "1 ms on one thread (medians of 3; 1 comparisons)" in text, text[:2000]


def test_explain_reports_the_backward_kernels_choice(two_threads):
    """A traced loss whose backward kernel holds the large weight-gradient products: its
    choice (here forced to one thread, the forward's to threads) is in hn.explain too."""
    tag = next(_TAGS)
    f = _fn(tag)
    x, w, u = _arrays(15)
    traced = hn.trace(lambda x, w, u: f(x, w, u).sum(), backend="llvm")
    xt, ut = hn.tensor(x), hn.tensor(u)
    wt = hn.tensor(w, requires_grad=True)
    for _ in range(3):
        wt.grad = None
        traced(xt, wt, ut).backward()
    kernels = [k for k in _kernels_of(traced) if getattr(k, "threads_choice", None)]
    assert len(kernels) == 2, kernels  # (forward, backward)
    _force(kernels[0].threads_choice, True)
    _force(kernels[1].threads_choice, False)
    text = str(hn.explain(traced))
    assert "on BLAS's threads" in text
    assert "on one thread" in text, [line for line in text.splitlines() if "BLAS" in line]


# ---- training steps --------------------------------------------------------------------


def _mlp_twin(seed):
    hn.manual_seed(seed)
    model = nn.Sequential(nn.Linear(1000, 800), nn.Tanh(), nn.Linear(800, 10))
    opt = hn.optim.Adam(model.parameters(), lr=1e-3)
    return training_step(model, opt), model, opt


def _mlp_state(model, opt):
    out = {}
    for i, p in enumerate(model.parameters()):
        out[f"p{i}"] = p.detach().numpy().copy()
        out[f"g{i}"] = p.grad.numpy().copy()
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{key}{i}"] = opt.state[p][key].numpy().copy()
    return out


def _mlp_batches(steps):
    rng = np.random.default_rng(16)
    return [(hn.tensor(rng.standard_normal((128, 1000)).astype(np.float32)),
             hn.tensor(rng.integers(0, 10, 128))) for _ in range(steps)]


def _run_traced_mlp(threaded, batches):
    thread_choice._EAGER.clear()
    step, model, opt = _mlp_twin(17)
    traced = hn.trace(step)
    losses = [traced(*batches[0]).item(), traced(*batches[1]).item()]  # (eager, traced)
    kernels = [k for k in _kernels_of(traced) if getattr(k, "threads_choice", None)]
    assert kernels, "the step's kernel chooses its BLAS threads"
    for k in kernels:
        _force(k.threads_choice, threaded)
    losses += [traced(*b).item() for b in batches[2:]]
    assert traced.stats.compiled_calls == len(batches) - 2, traced.stats
    for k in kernels:
        assert k.threads_choice.current is threaded
    return losses, _mlp_state(model, opt)


def test_traced_training_step_twins_in_each_mode_end_in_the_same_state(two_threads,
                                                                       monkeypatch):
    """nn.Linear(1000, 800), batch 128, Adam, the whole step traced: one twin's kernel
    runs its large products threaded, the other's on one thread; losses, parameters,
    .grad and Adam's moments identical; both match an eager twin (size rule)."""
    batches = _mlp_batches(7)
    wide_losses, wide = _run_traced_mlp(True, batches)
    one_losses, one = _run_traced_mlp(False, batches)
    monkeypatch.setenv("HYBRIDNET_BLAS_CHOICE", "size")
    step, model, opt = _mlp_twin(17)
    eager_losses = [step(*b).item() for b in batches]
    eager = _mlp_state(model, opt)
    np.testing.assert_allclose(wide_losses, eager_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one_losses, eager_losses, rtol=1e-5, atol=1e-6)
    for key in eager:
        np.testing.assert_allclose(wide[key], eager[key], rtol=1e-3, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(one[key], eager[key], rtol=1e-3, atol=1e-6, err_msg=key)
    for key in wide:  # (one thread and BLAS's threads: an ulp of round-off at most)
        np.testing.assert_allclose(wide[key], one[key], rtol=1e-5, atol=1e-7, err_msg=key)
    # under use_deterministic_algorithms two runs end in the same bits
    hn.use_deterministic_algorithms(True)
    try:
        first = _mlp_run_size_rule(batches)
        second = _mlp_run_size_rule(batches)
    finally:
        hn.use_deterministic_algorithms(False)
    assert first[0] == second[0]
    for key in first[1]:
        np.testing.assert_array_equal(first[1][key], second[1][key], err_msg=key)


def _mlp_run_size_rule(batches):
    step, model, opt = _mlp_twin(17)
    traced = hn.trace(step)
    losses = [traced(*b).item() for b in batches]
    return losses, _mlp_state(model, opt)


def _rnn_loss(cell):
    def loss(xs, y):
        h = hn.zeros(64, 512)
        for t in range(xs.shape[0]):
            h = cell(xs[t], h)
        return F.mse_loss(h, y)
    return loss


def test_rerolled_rnn_over_lengths_in_each_mode(two_threads):
    """An RNN over (T, 64, 512) for T in 8..40: one SymKernel forward and backward, the
    input projection hoisted (T*64 x 512 x 512: large). Loss and gradients per length
    identical with every kernel threaded and on one thread, and equal to eager's."""
    hn.manual_seed(18)
    cell = nn.RNNCell(512, 512)
    loss = _rnn_loss(cell)
    traced = hn.trace(loss)
    rng = np.random.default_rng(18)
    data = {T: (hn.tensor((rng.standard_normal((T, 64, 512)) * 0.5).astype(np.float32)),
                hn.tensor(rng.standard_normal((64, 512)).astype(np.float32)))
            for T in (8, 12, 17, 23, 40, 9, 31)}

    def run(f, T):  # noqa: N803
        cell.zero_grad()
        out = f(*data[T])
        out.backward()
        return out.item(), [p.grad.numpy().copy() for p in cell.parameters()]
    for T in (8, 40, 17):  # (the lengths below lie between: no probe, dynamic.Hull)
        run(traced, T)
    kernels = [k for k in _kernels_of(traced) if getattr(k, "threads_choice", None)]
    assert len(kernels) == 2 and all(type(k).__name__ == "SymKernel" for k in kernels)
    got = {}
    for threaded in (True, False):
        for k in kernels:
            _force(k.threads_choice, threaded)
        got[threaded] = {T: run(traced, T) for T in (23, 40, 9, 31, 12)}
    assert traced.stats.compiled_calls >= 10, traced.stats
    for T, (value, grads) in got[True].items():
        eager_value, eager_grads = run(loss, T)
        assert abs(value - eager_value) <= 1e-5 * max(1.0, abs(eager_value))
        for a, b in zip(grads, eager_grads):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    for T in got[True]:
        assert got[True][T][0] == got[False][T][0], T
        for i, (a, b) in enumerate(zip(got[True][T][1], got[False][T][1])):
            np.testing.assert_array_equal(a, b, err_msg=f"T={T}, gradient {i}")
