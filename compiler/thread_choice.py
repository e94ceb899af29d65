"""Whether large matrix products get BLAS's threads, decided by what they take on this
machine now, not by a rule that assumes an idle one.

An llvm kernel switches OpenBLAS to its threads around each product of at least
`compiler.blas.LARGE_MACS` multiply-adds (compiler/lowering/llvm_nodes.py, through the
setter word of its function table). On a quiet 2-core machine that made a 2-layer LSTM
language model's training step 1.23x faster than one thread; next to a busy process it
made it 1.43x slower, as each threaded product waits for the neighbour's core. Which
one holds changes while a program runs, so each such kernel measures it: its calls
alternate the two modes for a few calls, then run the faster one (the lower median
time), and compare again every `EVERY` calls. Writing the setter word (zero: every
product stays on one thread) flips the mode between calls, so the kernel's code is the
same either way. The cost is a few calls in the slower mode per `EVERY`.

A kernel for every length (SymKernel) compares time per step of its length. Eager
products of at least LARGE_MACS choose the same way, one chooser per product shape
(`compiler.blas.matmul`): an eager language-model step next to a busy process took
76-138 ms with its large products threaded and 68-72 ms on one thread (65-74 against
68 ms quiet).
"""

import os
import threading
import time

TRIAL = 3  # calls per mode in a comparison
EVERY = 100  # calls in the chosen mode between comparisons
MARGIN = 0.95  # the other mode must be this much faster (its median) to be chosen


_DETERMINISTIC = [False]  # hn.use_deterministic_algorithms


def set_deterministic(on: bool) -> None:
    """Bit-reproducible products (hn.use_deterministic_algorithms): no choosing by timing.
    BLAS gives different round-off on one thread and on its threads (an ulp, for some
    shapes), so a mode chosen by timing makes results depend on the machine's load."""
    _DETERMINISTIC[0] = bool(on)


def deterministic() -> bool:
    """Is set_deterministic(True) in force?"""
    return _DETERMINISTIC[0]


def choose_threads() -> bool:
    """Do large products choose by timing? Not under hn.use_deterministic_algorithms(True)
    or HYBRIDNET_BLAS_CHOICE=size, which keep the size rule alone (every large product
    on BLAS's threads)."""
    return not _DETERMINISTIC[0] and \
        os.environ.get("HYBRIDNET_BLAS_CHOICE", "").strip().lower() != "size"


class ThreadChooser:
    """The chosen mode, `threaded` (large products on BLAS's threads) or not, and
    `current`, the mode of the call running now; `set_mode(threaded)` applies a mode."""

    def __init__(self, set_mode=None):
        self._set_mode = set_mode
        self._lock = threading.Lock()  # (kernels run on several threads at once)
        self.threaded = self.current = True
        self.comparisons = 0  # comparisons made
        self.last = None  # (median threaded, median one thread) of the last comparison
        self._times = ([], [])  # per mode (one thread, threaded): this comparison's times
        self._calls = 0  # calls since the last comparison ended
        self._trial = -1  # call index within a comparison; -1: none running (first: warm-up)

    def start(self) -> bool:
        """Before a call: set its mode. Returns whether to time it."""
        return self._begin() is not None

    def _begin(self):
        """start(), returning the mode of a timed call, or None."""
        if not choose_threads():  # (turned off since: the size rule, threaded)
            if not self.current:
                self._set(True)
            return None
        with self._lock:
            if self._trial < 0:
                self._calls += 1
                if self._calls == 1 and self.comparisons == 0:
                    return None  # (the first call: buffers and caches warm up)
                if self.comparisons and self._calls <= EVERY:
                    return None
                self._trial = 0
                self._times = ([], [])
            mode = self._trial % 2 == 0  # (alternating, threaded first)
            self._set(mode)
            return mode

    def done(self, seconds: float, threaded=None) -> None:
        """After a timed call run in mode `threaded` (default: the turn's)."""
        with self._lock:
            if self._trial < 0:  # (another thread ended this comparison meanwhile)
                return
            if threaded is None:
                threaded = self._trial % 2 == 0
            self._times[threaded].append(seconds)
            self._trial += 1
            if self._trial < 2 * TRIAL:
                return
            if not all(self._times):  # (threads calling at once mixed the turns: again)
                self._trial, self._times = 0, ([], [])
                return
            one, wide = (sorted(t)[len(t) // 2] for t in self._times)
            self.last = (wide, one)
            if self.threaded:
                self.threaded = not one < MARGIN * wide
            else:
                self.threaded = wide < MARGIN * one
            self._set(self.threaded)
            self.comparisons += 1
            self._trial, self._calls = -1, 0

    def run(self, fn, *args, per=1, pass_mode=False):
        """fn(*args) in this chooser's mode, timed when a comparison needs it (`per`: the
        units its time is divided by, a SymKernel's length; `pass_mode`: call
        fn(threaded, *args)). A call that raises is no sample."""
        mode = self._begin()
        if pass_mode:
            args = (self.current if mode is None else mode,) + args
        if mode is None:
            return fn(*args)
        begin = time.perf_counter()
        out = fn(*args)
        self.done((time.perf_counter() - begin) / max(per, 1), mode)
        return out

    def _set(self, threaded: bool) -> None:
        self.current = threaded
        if self._set_mode is not None:
            self._set_mode(threaded)

    def describe(self) -> str:
        """One line for hn.explain."""
        mode = "on BLAS's threads" if self.threaded else "on one thread"
        if self.last is None:
            return f"large products {mode} (not compared yet)"
        wide, one = self.last
        return (f"large products {mode}: last comparison {wide * 1e3:.3g} ms threaded, "
                f"{one * 1e3:.3g} ms on one thread (medians of {TRIAL}; "
                f"{self.comparisons} comparisons)")


class KernelChooser(ThreadChooser):
    """The chooser of one compiled kernel: its mode is the setter word (`slot`) of its
    function table `fns` (zero: no product switches to BLAS's threads)."""

    def __init__(self, fns, slot):
        self._fns, self._slot = fns, slot
        self.setter = int(fns[slot])
        super().__init__(self._write)

    def _write(self, threaded: bool) -> None:
        self._fns[self._slot] = self.setter if threaded else 0


_EAGER = {}  # (a's shape, b's shape, dtype) -> ThreadChooser of eager products
MAX_SHAPES = 256  # product shapes remembered (then forgotten, all at once)


def eager_chooser(a, b) -> ThreadChooser:
    """The chooser of eager large products of a's and b's shapes and dtype."""
    key = (a.shape, b.shape, a.dtype)
    chooser = _EAGER.get(key)
    if chooser is None:
        if len(_EAGER) >= MAX_SHAPES:
            _EAGER.clear()
        chooser = _EAGER[key] = ThreadChooser()
    return chooser
