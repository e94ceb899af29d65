"""torch.set_num_threads / get_num_threads: how many threads hybridnet's parallel work
may use (compiled kernels that split rows, large BLAS products, Numba's loops)."""

import os
import sys

from compiler import blas, thread_choice
from runtime import llvm_kernel


def set_num_threads(n: int) -> None:
    """At most `n` threads for hybridnet's parallel work, from now on, process-wide:
    compiled kernels that split rows across threads use `n` (HYBRIDNET_THREADS is set to
    it), large matrix products run on `n` BLAS threads (small ones stay on one:
    compiler/blas.py), and Numba-compiled loops use at most `n` (when Numba is already
    imported; else Numba's pool is sized `n` when it starts)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RuntimeError(f"set_num_threads: expected a positive integer, got {n!r}")
    os.environ["HYBRIDNET_THREADS"] = str(n)
    llvm_kernel.reset_pool()
    blas.set_threads(n)
    llvm_kernel.rebind_blas()  # (compiled kernels' tables: the new count)
    numba = sys.modules.get("numba")
    if numba is None:
        os.environ["NUMBA_NUM_THREADS"] = str(n)
    else:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def get_num_threads() -> int:
    """The threads parallel work may use (set_num_threads's `n`; by default
    HYBRIDNET_THREADS, else the CPUs this process may run on)."""
    return llvm_kernel.threads()


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """As torch.use_deterministic_algorithms: with `mode` True, results are the same bits
    from run to run. hybridnet's one source of run-to-run variation is the choice of
    BLAS threads for large products by timing (compiler/thread_choice.py): one thread and
    several round differently (an ulp, for some shapes), so it follows the machine's
    load. Deterministic mode keeps the size rule alone (large products always on BLAS's
    threads). `warn_only` is accepted for PyTorch's signature (nothing here warns)."""
    if not isinstance(mode, bool):
        raise TypeError(f"use_deterministic_algorithms: expected a bool, got {mode!r}")
    thread_choice.set_deterministic(mode)


def are_deterministic_algorithms_enabled() -> bool:
    """Whether use_deterministic_algorithms(True) is in force."""
    return thread_choice.deterministic()
