"""How matrix products use BLAS threads: one thread for small products, BLAS's own thread
count only for large ones (PyTorch, too, threads only large ops).

Why: on a 2-core machine with another process busy, OpenBLAS's worker threads wait for
a core the neighbour holds; a (32,128)x(128,128) product then takes several times longer
with 2 threads than with 1, and an eager RNN backward over 64 steps was 1.5x slower.
Measured here, a second thread makes products of 2-8 million multiply-adds 1.4x
faster on a quiet machine but 1.2-1.5x slower next to a busy process; from about 12
million it wins in both. So a BLAS call of `LARGE_MACS` (10^7) multiply-adds or more gets
BLAS's threads, and a smaller one runs on one thread whatever the neighbours do
(`benchmarks/blas_threads.py`). Size is per BLAS call (m*k*n): a batched product calls
BLAS once per item.

`configure()` puts every BLAS library on one thread (run by `import hybridnet`, and
again by the Numba engine once Numba has loaded SciPy's BLAS). Eager products use
NumPy's BLAS: `matmul(a, b)`, the registry's matmul impl, raises its count for the
duration of a large product only, so outside one it is on one thread. Compiled kernels
call SciPy's BLAS (Numba's np.dot): before each call of a kernel that uses BLAS,
`kernel_threads(large)` sets that library to BLAS's threads when most of the kernel's
multiply-adds are in large products (`kernel_is_large`), else to one, changing it only
when the choice changes (switching it on every call of a small compiled layer made the
call 100x slower next to a busy process: waking parked threads each time).

`HYBRIDNET_BLAS_THREADS=N` fixes N threads for every product instead, and
`HYBRIDNET_BLAS_THREADS=keep` leaves the libraries as they are. The setting is
process-wide: the user's own NumPy products run on one BLAS thread too.
"""

import contextlib
import os

import numpy as np
from threadpoolctl import ThreadpoolController

LARGE_MACS = 10_000_000  # multiply-adds of one BLAS call from which it gets BLAS's threads

_libs = []  # threadpoolctl controllers of the BLAS libraries configured
_paths = set()
_count = {}  # library path -> threads it uses now
_roles = {"eager": [], "kernel": []}  # NumPy's libraries; the others (SciPy's)
_wide = [1]  # threads a large product uses (1: never switch)
_mode = []  # [None | "keep" | N], read from the environment once


def _setting():
    """None (the size rule), "keep", or a fixed thread count, from the environment."""
    if not _mode:
        raw = os.environ.get("HYBRIDNET_BLAS_THREADS", "").strip()
        if not raw:
            _mode.append(None)
        elif raw.lower() == "keep":
            _mode.append("keep")
        elif raw.isdigit() and int(raw) > 0:
            _mode.append(int(raw))
        else:
            raise ValueError(f"HYBRIDNET_BLAS_THREADS={raw!r}: expected a positive thread "
                             f"count, 'keep', or nothing (one thread below {LARGE_MACS} "
                             f"multiply-adds per product)")
    return _mode[0]


def configure() -> None:
    """Put every BLAS library loaded so far (and not yet seen) on one thread."""
    mode = _setting()
    if mode == "keep":
        return
    for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
        if lib.filepath in _paths:
            continue
        _paths.add(lib.filepath)
        _libs.append(lib)
        _roles["eager" if "numpy" in lib.filepath else "kernel"].append(lib)
        if mode is None:
            _wide[0] = max(_wide[0], lib.num_threads)
        lib.set_num_threads(mode or 1)
        _count[lib.filepath] = mode or 1


def threads() -> dict:
    """{library path: threads it uses now} (for benchmarks and tests)."""
    return {lib.filepath: lib.num_threads for lib in _libs}


def _set(n, libs=None):
    for lib in _libs if libs is None else libs:
        if _count.get(lib.filepath) != n:
            lib.set_num_threads(n)
            _count[lib.filepath] = n


def _role(name):
    return _roles[name] or _libs  # (one BLAS library shared by NumPy and SciPy: that one)


def macs(a_shape, b_shape) -> int:
    """Multiply-adds of one BLAS call of the product a @ b: m * k * n."""
    m = a_shape[-2] if len(a_shape) > 1 else 1
    n = b_shape[-1] if len(b_shape) > 1 else 1
    return m * (a_shape[-1] if a_shape else 1) * n


def matmul(a, b) -> np.ndarray:
    """np.matmul, with BLAS's threads for the duration of a large float product."""
    # (one BLAS call has at most a.size * b.size multiply-adds: one test rejects most)
    if _wide[0] > 1 and a.size * b.size >= LARGE_MACS and a.dtype.kind == "f" and \
            macs(a.shape, b.shape) >= LARGE_MACS:
        return threaded(np.matmul, a, b)
    return np.matmul(a, b)


def threaded(fn, *args):
    """fn(*args) with NumPy's BLAS on BLAS's threads, restored after (also on error)."""
    libs = _role("eager")
    before = [_count.get(lib.filepath, 1) for lib in libs]
    _set(_wide[0], libs)
    try:
        return fn(*args)
    finally:
        for lib, n in zip(libs, before):
            _set(n, [lib])


def kernel_threads(large: bool) -> None:
    """Before a compiled kernel that calls BLAS: SciPy's BLAS on BLAS's threads for a
    large kernel, else on one (changed only when the choice changes)."""
    if _wide[0] > 1:
        _set(_wide[0] if large else 1, _role("kernel"))


def kernel_is_large(products) -> bool:
    """Should a kernel holding `products` ((a_shape, b_shape) pairs) run with BLAS's
    threads? When at least 2/3 of its multiply-adds are in large BLAS calls: an RNN's
    one large input projection beside its many small recurrent products is not."""
    sizes = [(macs(a, b), _batch(a, b)) for a, b in products]
    total = sum(m * k for m, k in sizes)
    large = sum(m * k for m, k in sizes if m >= LARGE_MACS)
    return total > 0 and 3 * large >= 2 * total


def _batch(a_shape, b_shape) -> int:
    batch = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    return int(np.prod(batch)) if batch else 1


@contextlib.contextmanager
def every_product_threaded():
    """Every product on BLAS's threads inside the block: NumPy's own default, for
    comparisons (`benchmarks/blas_threads.py`). A no-op under a fixed or kept count."""
    wide = _wide[0]
    if wide == 1:
        yield
        return
    _set(wide)
    _wide[0] = 1
    try:
        yield
    finally:
        _wide[0] = wide
        _set(1)
