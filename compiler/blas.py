"""How matrix products use BLAS threads: one thread for small products, BLAS's own thread
count only for large ones (PyTorch, too, threads only large ops).

Why: on a 2-core machine with another process busy, OpenBLAS's worker threads wait for
a core the neighbour holds; a (32,128)x(128,128) product then takes several times longer
with 2 threads than with 1, and an eager RNN backward over 64 steps was 1.5x slower.
Measured here, a second thread makes products of 2-8 million multiply-adds 1.4x
faster on a quiet machine but 1.2-1.5x slower next to a busy process; from about 12
million it won in both, measured product by product. Inside a whole step it did not: a
W2 MLP step (two products of 12.8 million) ran at 1.4 ms eagerly next to a busy process,
until an llvm-compiled step had run in the same process; from then on 48 ms, every
time (BLAS's worker had to wait for the core the neighbour held, once per product). So a
BLAS call of `LARGE_MACS` (5 * 10^7, about 0.7 ms on one thread) multiply-adds or more
gets BLAS's threads, where a stall of a scheduler slice costs at most a few times the
product, and a smaller one runs on one thread whatever the neighbours do
(`benchmarks/blas_threads.py`). Size is per BLAS call (m*k*n): a batched product calls
BLAS once per item.

`configure()` puts every BLAS library on one thread (run by `import hybridnet`, and
again once SciPy's BLAS is loaded). Only SciPy's BLAS (`scipy.linalg.cython_blas`)
ever gets more: compiled kernels call it (the llvm backend by address, Numba's np.dot),
and a large eager 2-D product (`matmul`, the registry's matmul impl) calls its ?gemm
too. NumPy's and SciPy's OpenBLAS are two libraries with a worker-thread pool each, and
a pool's workers spin for a while after every threaded call: when eager products ran
threaded in NumPy's pool between compiled ones in SciPy's, the two pools fought over
the 2 cores and an MLP's calls took 10x longer (100x next to a busy process). NumPy's
pool therefore stays on one thread (a large batched eager product, which its gemm cannot
take, gets NumPy's threads for that call only). Before each call of a kernel that uses
BLAS, `kernel_threads(large)` sets SciPy's library to BLAS's threads when most of the
kernel's multiply-adds are in large products (`kernel_is_large`), else to one, changing
it only when the choice changes (switching it on every call of a small compiled layer
made the call 100x slower next to a busy process: waking parked threads each time).
An llvm kernel decides per product instead: it runs on one thread and, around each
product of at least LARGE_MACS (decided at run time, from the sizes), calls OpenBLAS's
`openblas_set_num_threads` (its address in the kernel's function table, SET_THREADS) to
BLAS's count and back to 1. A language model's step holds 8 large products (its LSTM's
input projections and weight gradients, hoisted out of the loops, and its head) beside
140 small recurrent ones in its loops: with the whole kernel on BLAS's threads, every
small product could wait for a busy neighbour's core (120 ms a step against 60 ms on one
thread; 50 ms quiet). Switching per product: 54 ms quiet, 97 ms next to a busy process
(one thread: 66 and 68 ms), as eager threads the same products.

OpenBLAS's idle workers spin for 2**28 cycles (about 0.1 s) after each threaded call
before they sleep; with a busy neighbour, the spinning worker and the neighbour then
share the core our main thread needs, and a W2 eager MLP step took 2.6x longer with
BLAS threads than without (7.2 ms against 2.6 ms; 2.1 ms quiet). So SciPy's OpenBLAS
(the one that ever gets threads) is loaded with OPENBLAS_THREAD_TIMEOUT=18 (2**18
cycles, about 0.1 ms) unless the environment already sets it: threads then win next to
a busy process too (2.07 ms against 2.27 ms on one thread). It must be set before that
library loads, so a program that imported scipy.linalg before hybridnet keeps the
default spin.

`HYBRIDNET_BLAS_THREADS=N` fixes N threads for every product instead, and
`HYBRIDNET_BLAS_THREADS=keep` leaves the libraries as they are. The setting is
process-wide: the user's own NumPy products run on one BLAS thread too.
"""

import contextlib
import ctypes
import importlib.machinery
import importlib.util
import os
import sys

import numpy as np
from threadpoolctl import ThreadpoolController

from .thread_choice import choose_threads, eager_chooser

SPIN = "18"  # OPENBLAS_THREAD_TIMEOUT for SciPy's OpenBLAS: idle workers sleep after 2**18 cycles
LARGE_MACS = 50_000_000  # multiply-adds of one BLAS call from which it gets BLAS's threads

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN)  # read when SciPy's OpenBLAS loads

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


def set_threads(n: int) -> None:
    """At most `n` BLAS threads from now on: under the size rule, large products get `n`
    and small ones stay on one; a fixed HYBRIDNET_BLAS_THREADS count becomes `n`; with
    HYBRIDNET_BLAS_THREADS=keep every BLAS library is set to `n` (an explicit call)."""
    mode = _setting()
    if mode == "keep":
        for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
            lib.set_num_threads(n)
        return
    try:  # SciPy's BLAS now, so that loading it later cannot raise the count again
        _cython_blas()
        configure()
    except ImportError:
        pass
    if mode is None:
        _wide[0] = n
        _set(1)
    else:
        _mode[0] = n
        _set(n)


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
    """np.matmul; a large float product runs on BLAS's threads, in SciPy's BLAS (the one
    compiled kernels call) for 2-D operands, so that one BLAS thread pool at most ever
    has threads: NumPy's and SciPy's OpenBLAS each keep their worker threads spinning
    after a threaded call, and eager and compiled products taking turns made both pools
    fight for the 2 cores (an MLP's calls 10x slower, 100x next to a busy process)."""
    # (one BLAS call has at most a.size * b.size multiply-adds: one test rejects most)
    if _wide[0] > 1 and a.size * b.size >= LARGE_MACS and a.dtype.kind == "f" and \
            macs(a.shape, b.shape) >= LARGE_MACS and a.ndim and b.ndim and \
            a.shape[-1] == (b.shape[-2] if b.ndim > 1 else b.shape[0]):
        if not choose_threads():
            return _large_product(True, a, b)
        chooser = eager_chooser(a, b)  # (threads or not, by timing: compiler.thread_choice)
        return chooser.run(_large_product, a, b, pass_mode=True)
    return np.matmul(a, b)  # (also every mismatch: NumPy's error names the shapes)


def _large_product(wide, a, b) -> np.ndarray:
    """a @ b on BLAS's threads (`wide`) or on one; 2-D in SciPy's BLAS either way, the
    library compiled kernels call (its round-off may still differ by an ulp between one
    thread and several, for some shapes)."""
    if a.ndim == b.ndim == 2 and a.dtype == b.dtype and a.dtype in GEMM:
        return _scipy_gemm(a, b, wide)
    return threaded(np.matmul, a, b) if wide else np.matmul(a, b)


GEMM = {np.dtype(np.float32): ("sgemm", ctypes.c_float),
        np.dtype(np.float64): ("dgemm", ctypes.c_double)}
_GEMM_FNS = {}  # dtype -> the ctypes function of SciPy's ?gemm


def _scipy_gemm(a, b, wide=True) -> np.ndarray:
    """a @ b (2-D, one float dtype, a's columns as many as b's rows) by SciPy's Fortran
    ?gemm, on BLAS's threads (`wide`) or one. Fortran computes the transposed product:
    C^T (n x m) = B^T A^T, reading row-major buffers as their transposes."""
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k:  # (BLAS would read past b's end)
        raise ValueError(f"matmul: {list(a.shape)} @ {list(b.shape)}: sizes do not match")
    name, scalar = GEMM[a.dtype]
    fn = _GEMM_FNS.get(a.dtype)
    if fn is None:
        fn = _GEMM_FNS[a.dtype] = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)(
            scipy_pointers([name])[0])
    b, tb, ldb = _fortran_operand(b, n)
    a, ta, lda = _fortran_operand(a, k)
    out = np.empty((m, n), dtype=a.dtype)
    ints = [ctypes.c_int(v) for v in (n, m, k, ldb, lda, n)]
    one, zero = scalar(1.0), scalar(0.0)
    kernel_threads(wide)
    p = ctypes.byref
    fn(p(tb), p(ta), p(ints[0]), p(ints[1]), p(ints[2]), p(one), b.ctypes.data, p(ints[3]),
       a.ctypes.data, p(ints[4]), p(zero), out.ctypes.data, p(ints[5]))
    return out


def _fortran_operand(x, rows_c):
    """(buffer, trans, ld) giving Fortran x^T: a row-major x (r x c) is x^T as Fortran
    ('N', ld c); a column-major one is x itself ('T', ld r)."""
    if x.flags.c_contiguous:
        return x, ctypes.c_char(b"N"), rows_c
    if x.flags.f_contiguous:
        return x, ctypes.c_char(b"T"), x.shape[0]
    return np.ascontiguousarray(x), ctypes.c_char(b"N"), rows_c


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


SET_THREADS = "set_threads"  # (in an llvm kernel's `fns`: BLAS's thread setter, or null)
THREADS = "threads"  # (and the count a large product gets)


def scipy_pointers(names) -> list:
    """Addresses of SciPy's Fortran BLAS routines (`scipy.linalg.cython_blas`), by name;
    puts that library on one thread (`configure`) once it is loaded. SET_THREADS: its
    `openblas_set_num_threads` when products are threaded by size (else 0: the kernel
    never switches), THREADS: the count a large product gets."""
    if not names:
        return []
    capi = _cython_blas().__pyx_capi__
    configure()
    setter = _setter()
    special = {SET_THREADS: setter, THREADS: _wide[0] if setter else 1}
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return [special[name] if name in special else get_ptr(capi[name], get_name(capi[name]))
            for name in names]


def _setter() -> int:
    """The address of SciPy's OpenBLAS `openblas_set_num_threads`, or 0 where products
    are not threaded by size (a fixed or kept count, one core, another BLAS)."""
    if _setting() is not None or _wide[0] <= 1:
        return 0
    for lib in _role("kernel"):
        try:
            return ctypes.cast(lib._get_symbol("openblas_set_num_threads"),
                               ctypes.c_void_p).value or 0
        except Exception:  # noqa: BLE001 - not OpenBLAS, or no such symbol: no switching
            return 0
    return 0


def _cython_blas():
    """scipy.linalg.cython_blas, loaded on its own when scipy.linalg is not imported yet:
    importing scipy.linalg takes ~0.3 s, the extension module alone ~7 ms. It is
    registered under its own name, so a later `import scipy.linalg` uses it."""
    name = "scipy.linalg.cython_blas"
    if name in sys.modules:
        return sys.modules[name]
    try:
        spec = importlib.util.find_spec("scipy")
        folder = os.path.join(spec.submodule_search_locations[0], "linalg")
        path = next(os.path.join(folder, f"cython_blas{suffix}")
                    for suffix in importlib.machinery.EXTENSION_SUFFIXES
                    if os.path.exists(os.path.join(folder, f"cython_blas{suffix}")))
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location(name, path, loader=loader))
        loader.exec_module(module)
        sys.modules[name] = module
        return module
    except Exception:  # noqa: BLE001  (any surprise: the ordinary import)
        sys.modules.pop(name, None)
        from scipy.linalg import cython_blas
        return cython_blas


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
