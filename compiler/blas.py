"""How matrix products use BLAS threads: one thread for small products, BLAS's own thread
count only for large ones (PyTorch, too, threads only large ops).

Why: on a 2-core machine with another process busy, OpenBLAS's worker threads wait for
a core the neighbour holds; a (32,128)x(128,128) product then takes several times longer
with 2 threads than with 1, and an eager RNN backward over 64 steps was 13x slower.
Products of `LARGE_MACS` multiply-adds or more gain from a second thread even with a
busy neighbour (measured in `benchmarks/blas_threads.py`), so they get BLAS's threads.

`configure()` puts every BLAS library loaded so far on one thread (run by
`import hybridnet`, and again by the Numba engine once Numba has loaded SciPy's BLAS).
`matmul(a, b)` is the reference product (the registry's impl): it gives a large product
BLAS's threads and a small one a single thread; a compiled kernel holding a large
product does the same (`use_threads`). `HYBRIDNET_BLAS_THREADS=N` fixes N threads for every
product instead, and `HYBRIDNET_BLAS_THREADS=keep` leaves the libraries as they are.
(The setting is process-wide, so NumPy
code of the user's own runs on one BLAS thread too once hybridnet is imported.)
"""

import contextlib
import math
import os

import numpy as np
from threadpoolctl import ThreadpoolController

LARGE_MACS = 1 << 22  # multiply-adds from which a product uses BLAS's threads

_libs = []  # threadpoolctl controllers of the BLAS libraries configured
_paths = set()
_wide = [1]  # threads a large product uses (1: no switching)
_now = [1]  # threads the libraries use now


def configure() -> None:
    """Set every BLAS library loaded so far (and not yet seen) to one thread."""
    fixed = os.environ.get("HYBRIDNET_BLAS_THREADS", "").strip()
    if fixed == "keep":
        return
    for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
        if lib.filepath in _paths:
            continue
        _paths.add(lib.filepath)
        _libs.append(lib)
        if fixed:
            lib.set_num_threads(max(1, int(fixed)))
            continue
        _wide[0] = max(_wide[0], lib.num_threads)
        lib.set_num_threads(_now[0])


def threads() -> dict:
    """{library path: threads it uses now} (for benchmarks and tests)."""
    return {lib.filepath: lib.num_threads for lib in _libs}


def _set(n):
    for lib in _libs:
        lib.set_num_threads(n)
    _now[0] = n


def macs(a_shape, b_shape) -> int:
    """Multiply-adds of a product of operands shaped `a_shape` @ `b_shape` (batch too)."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        return math.prod(a_shape) * (b_shape[-1] if len(b_shape) > 1 else 1)
    return max(math.prod(a_shape) * b_shape[-1], math.prod(b_shape) * a_shape[-2])


def use_threads(large: bool) -> None:
    """Before BLAS work: BLAS's threads if it holds a large product, else one. The count
    is changed only when it differs (waking parked BLAS threads costs, next to a busy
    process, about a millisecond), so a run of large products keeps its threads."""
    if _wide[0] == 1:
        return  # (one thread everywhere, or a fixed count)
    want = _wide[0] if large else 1
    if _now[0] != want:
        _set(want)


def matmul(a, b) -> np.ndarray:
    """np.matmul, with BLAS's threads for a large product and one thread otherwise."""
    # (a product has at most a.size * b.size multiply-adds: one test rejects most)
    if a.size * b.size >= LARGE_MACS or _now[0] != 1:
        use_threads(macs(a.shape, b.shape) >= LARGE_MACS)
    return np.matmul(a, b)


@contextlib.contextmanager
def every_product_threaded():
    """Every product on BLAS's threads inside the block: NumPy's own default, for
    comparisons (`benchmarks/blas_threads.py`)."""
    wide = _wide[0]
    _set(wide)
    _wide[0] = 1
    try:
        yield
    finally:
        _wide[0] = wide
        _set(1)
