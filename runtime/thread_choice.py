"""Whether a compiled kernel's large matrix products get BLAS's threads, decided by what
its calls take on this machine now, not by a rule that assumes an idle one.

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

A kernel for every length (SymKernel) compares time per step of its length.
"""

import os
import time

TRIAL = 3  # calls per mode in a comparison
EVERY = 100  # calls in the chosen mode between comparisons
MARGIN = 0.95  # the other mode must be this much faster (its median) to be chosen


def choose_threads() -> bool:
    """Do kernels choose by timing? HYBRIDNET_BLAS_CHOICE=size keeps the size rule alone
    (every large product threaded)."""
    return os.environ.get("HYBRIDNET_BLAS_CHOICE", "").strip().lower() != "size"


class ThreadChooser:
    """The mode of one kernel: `threaded` (large products on BLAS's threads) or not;
    `fns`: the kernel's function table, `slot`: its setter word's index."""

    def __init__(self, fns, slot):
        self._fns, self._slot = fns, slot
        self.setter = int(fns[slot])
        self.threaded = True
        self.comparisons = 0  # comparisons made
        self.last = None  # (median threaded, median one thread) of the last comparison
        self._times = ([], [])  # per mode (one thread, threaded): this comparison's times
        self._calls = 0  # calls since the last comparison ended
        self._trial = -1  # call index within a comparison; -1: none running (first: warm-up)

    def start(self) -> bool:
        """Before a call: set its mode. Returns whether to time it."""
        if self._trial < 0:
            self._calls += 1
            if self._calls == 1 and self.comparisons == 0:
                return False  # (the first call: buffers and caches warm up)
            if self.comparisons and self._calls <= EVERY:
                return False
            self._trial = 0
            self._times = ([], [])
        self._set(self._trial % 2 == 0)  # (alternating, threaded first)
        return True

    def done(self, seconds: float) -> None:
        """After a timed call of the mode start() set."""
        self._times[self._trial % 2 == 0].append(seconds)
        self._trial += 1
        if self._trial < 2 * TRIAL:
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

    def run(self, fn, *args, per=1):
        """fn(*args) in this kernel's mode, timed when a comparison needs it (`per`: the
        units its time is divided by, a SymKernel's length)."""
        if not self.start():
            return fn(*args)
        begin = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.done((time.perf_counter() - begin) / max(per, 1))

    def _set(self, threaded: bool) -> None:
        self._fns[self._slot] = self.setter if threaded else 0

    def describe(self) -> str:
        """One line for hn.explain."""
        mode = "on BLAS's threads" if self.threaded else "on one thread"
        if self.last is None:
            return f"large products {mode} (not compared yet)"
        wide, one = self.last
        return (f"large products {mode}: last comparison {wide * 1e3:.3g} ms threaded, "
                f"{one * 1e3:.3g} ms on one thread (medians of {TRIAL}; "
                f"{self.comparisons} comparisons)")
