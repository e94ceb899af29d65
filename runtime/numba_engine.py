"""The Numba engine: turn generated entry source into one jitted function.

Kernels are cached on disk: the generated source becomes a small module file named
by the hash of its content (with the hybridnet, NumPy and Numba versions folded
in), and Numba's own cache (`cache=True`, keyed by signature and CPU) stores the
machine code beside it, so a new process loads a kernel instead of compiling it.
A damaged or unreadable entry is rewritten or bypassed, never trusted: the file
must hold exactly the expected source. HYBRIDNET_CACHE=0 turns the disk cache off;
HYBRIDNET_CACHE_DIR moves it (default ~/.cache/hybridnet). Either way the source
is registered with `linecache`, so tracebacks show the generated code.

A split program (`program.chunks`, see compiler.lowering.split) becomes a
`SplitKernel`: each distinct kernel is compiled (or loaded) once per process and
shared by every program that contains it, and a plain-Python driver calls them.
"""

import hashlib
import importlib.util
import linecache
import os
import sys
import tempfile
import time

import numpy as np

from compiler import blas

# Flags that keep IEEE inf/nan semantics (no 'nnan'/'ninf') but let LLVM vectorize
# reductions and fuse multiply-adds.
FASTMATH = {"reassoc", "contract"}  # no nsz: LLVM would fold x + 0.0 and (x + c) - c


class CompiledKernel:
    """A jitted entry plus its source; call it with the graph's input arrays."""

    def __init__(self, fn, source: str, filename: str, program):
        self.fn = fn
        self.source = source
        self.filename = filename
        self.program = program
        self.compile_seconds = 0.0
        self.compiled = False
        self.from_disk = False
        self._jitted = None
        self._inspect = None  # an uncached twin of a disk-cached kernel, for its IR

    @property
    def jitted(self):
        """The Numba dispatcher (`fn` is it, or once compiled it behind the BLAS thread
        choice of a kernel that calls BLAS)."""
        return self._jitted or self.fn

    def __call__(self, *arrays):
        if not self.compiled:
            start = time.perf_counter()
            try:
                out = with_blas_threads(self.fn, self.program)(*arrays)
            except Exception:
                if not self.from_disk:
                    raise
                # A damaged disk entry: forget it and compile in memory instead.
                _discard_disk_entry(self.filename)
                self.fn = _in_memory(self.program).fn
                self.from_disk = False
                out = with_blas_threads(self.fn, self.program)(*arrays)
            blas.configure()  # (Numba calls SciPy's BLAS, loaded by the compile)
            self.compile_seconds = time.perf_counter() - start
            self.compiled = True
            self._jitted, self.fn = self.fn, with_blas_threads(self.fn, self.program)
            return out
        return self.fn(*arrays)

    @property
    def llvm_ir(self) -> str:
        """LLVM IR of every compiled signature (empty before the first call). Numba keeps
        no IR for code it loaded from its disk cache ("Inspection disabled for cached
        code"): that code is compiled once more, in memory, for the IR."""
        jitted = self.jitted
        if self.cache_hits:
            jitted = self._inspectable()
        return "\n".join(jitted.inspect_llvm().values())

    def _inspectable(self):
        if self._inspect is None:
            import numba

            src = self.jitted
            options = {k: v for k, v in src.targetoptions.items() if k not in ("cache", "nopython")}
            fresh = numba.njit(**options)(src.py_func)
            for sig in src.signatures:
                fresh.compile(sig)
            self._inspect = fresh
        return self._inspect

    @property
    def cache_hits(self) -> int:
        """Signatures Numba loaded from its disk cache instead of compiling."""
        return sum(self.jitted.stats.cache_hits.values())

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.filename} compiled={self.compiled}>"


def with_blas_threads(fn, program):
    """`fn`, preceded by the BLAS thread choice for the program (`compiler.blas`) when
    its kernels call BLAS: BLAS's threads for a large program, else one."""
    if not getattr(program, "uses_blas", False):
        return fn
    large, choose = bool(getattr(program, "large_products", False)), blas.kernel_threads

    def call(*arrays):
        choose(large)
        return fn(*arrays)
    return call


def _options(program) -> dict:
    parallel = bool(getattr(program, "parallel", False))
    if parallel:
        _prefer_workqueue()
    return dict(error_model="numpy", fastmath=FASTMATH, nogil=True, parallel=parallel)


def _prefer_workqueue():
    """Parallel kernels use Numba's 'workqueue' threads unless the user chose a layer:
    its OpenMP layer busy-waits and stalled ~8 ms a call here whenever another process
    held a core, and changing OpenMP's settings would also change other libraries'."""
    import numba
    if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "workqueue"


def compile_program(program):
    """Wrap the generated entry with numba.njit (compiled lazily, cached on disk); a split
    program gets a SplitKernel driving its shared kernels."""
    if getattr(program, "chunks", None):
        return SplitKernel(program)
    return compile_single(program)


def compile_single(program) -> CompiledKernel:
    """One jitted function for `program` (its `entry`), from the disk cache if there."""
    _resolve_bodies(program)
    try:
        cached = _from_disk(program)
    except Exception:  # noqa: BLE001  (an unusable cache never stops compilation)
        cached = None
    return cached if cached is not None else _in_memory(program)


def _in_memory(program) -> CompiledKernel:
    import numba

    digest = hashlib.sha256(program.source.encode()).hexdigest()[:12]
    filename = f"<hybridnet-kernel-{digest}>"
    linecache.cache[filename] = (len(program.source), None,
                                 program.source.splitlines(True), filename)
    namespace = dict(program.globals)
    namespace.setdefault("np", np)
    namespace["prange"] = numba.prange
    exec(compile(program.source, filename, "exec"), namespace)  # noqa: S102 (our own codegen)
    fn = numba.njit(**_options(program))(namespace[program.entry])
    return CompiledKernel(fn, program.source, filename, program)


# Loop bodies (a Program among a program's globals, see compiler.lowering.loop_rule), by
# source: compiled once per process and called from the entries that run the loop.
_BODIES = {}


def _resolve_bodies(program):
    """Replace each Program among `program.globals` by its jitted function."""
    for name, value in list(program.globals.items()):
        if hasattr(value, "source") and hasattr(value, "entry") and hasattr(value, "units"):
            kernel = _BODIES.get(value.source)
            if kernel is None:
                kernel = _BODIES[value.source] = compile_single(value)
            program.globals[name] = kernel.jitted


# ---- the disk cache ---------------------------------------------------------------------


def cache_dir():
    """The kernel cache folder, or None when disabled or not writable."""
    if os.environ.get("HYBRIDNET_CACHE", "1") == "0":
        return None
    base = os.environ.get("HYBRIDNET_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "hybridnet")
    path = os.path.join(base, "kernels")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


def _literal(value) -> str:
    item = value.item()
    if isinstance(item, float):
        text = repr(item) if item != item or item in (float("inf"), float("-inf")) \
            else f"float.fromhex({item.hex()!r})"
        if text in ("nan", "inf", "-inf"):
            text = f"float({text!r})"
        return f"np.{value.dtype.name}({text})"
    return f"np.{value.dtype.name}({item!r})"


# Array constants up to this many elements are written into the module (bigger ones keep
# the kernel in memory only).
ARRAY_LITERAL_LIMIT = 1 << 16


def _array_literal(value):
    """Source rebuilding `value` exactly (bytes for bytes), or None when too big."""
    if value.size > ARRAY_LITERAL_LIMIT:
        return None
    shape, dtype = tuple(value.shape), value.dtype.str
    first = value.flat[0] if value.size else None
    if value.size and first == first and \
            np.full(shape, first, value.dtype).tobytes() == value.tobytes():
        return f"np.full({shape!r}, {_literal(first)}, np.dtype({dtype!r}))"
    data = np.ascontiguousarray(value).tobytes().hex()
    return (f"np.frombuffer(bytes.fromhex({data!r}), np.dtype({dtype!r}))"
            f".reshape({shape!r}).copy()")


def module_source(program):
    """The generated entry as a self-contained module, or None if it needs live objects."""
    lines = ["import math", "", "import numpy as np", "from numba import prange", ""]
    for name, value in sorted(program.globals.items()):
        if name in ("np", "math"):
            continue
        if isinstance(value, np.generic):
            lines.append(f"{name} = {_literal(value)}")
            continue
        if isinstance(value, np.ndarray):
            text = _array_literal(value)
            if text is None:
                return None  # a big array stays in memory
            lines.append(f"{name} = {text}")
            continue
        py = getattr(value, "py_func", None)
        if py is None or "<" in py.__qualname__ or not py.__module__:
            return None  # other live objects stay in memory
        # (a loop body from the disk cache: its module holds the jitted entry as well)
        attr = f"jitted_{py.__name__}" if py.__module__.startswith("hybridnet_kernel_") \
            else py.__name__
        lines.append(f"from {py.__module__} import {attr} as {name}")
    return "\n".join(lines) + "\n\n\n" + program.source


def _versions() -> str:
    from importlib import metadata  # (loads email, csv, socket...: ~10 ms at import)

    import numba
    try:
        own = metadata.version("hybridnet")
    except metadata.PackageNotFoundError:
        own = "dev"
    return f"hybridnet={own} numpy={np.__version__} numba={numba.__version__}"


def _write_atomic(path, text):
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".k-", suffix=".py", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _from_disk(program):
    folder = cache_dir()
    text = module_source(program) if folder else None
    if text is None:
        return None
    import numba

    options = {k: sorted(v) if isinstance(v, set) else v for k, v in _options(program).items()}
    key = hashlib.sha256((text + _versions() + repr(sorted(options.items()))
                          ).encode()).hexdigest()
    path = os.path.join(folder, f"k_{key[:32]}.py")
    try:
        with open(path) as f:
            intact = f.read() == text
    except (OSError, UnicodeDecodeError):
        intact = False
    if not intact:  # missing or damaged: (re)write it
        _write_atomic(path, text)
    name = f"hybridnet_kernel_{key[:32]}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Numba's cache re-imports the module by name
        spec.loader.exec_module(module)
    fn = getattr(module, f"jitted_{program.entry}", None)
    if fn is None:
        fn = numba.njit(cache=True, **_options(program))(getattr(module, program.entry))
        setattr(module, f"jitted_{program.entry}", fn)  # (what loops that call it import)
    linecache.checkcache(path)
    kernel = CompiledKernel(fn, program.source, path, program)
    kernel.from_disk = True
    return kernel


def _discard_disk_entry(path):
    """Remove Numba's cache files for a kernel module (best effort); the module itself
    was checked against the expected source, so it stays."""
    folder, base = os.path.split(path)
    stem = base[:-3]
    cache = os.path.join(folder, "__pycache__")
    doomed = [os.path.join(cache, f) for f in
              (os.listdir(cache) if os.path.isdir(cache) else []) if f.startswith(stem)]
    for f in doomed:
        try:
            os.unlink(f)
        except OSError:
            pass


# ---- split programs -----------------------------------------------------------------------

# The distinct kernels of split programs, by content (Chunk.key): shared process-wide, so
# an unrolled loop's steps, and programs that contain the same steps, compile them once.
_SHARED_PARTS = {}


def shared_part(chunk) -> CompiledKernel:
    """The process-wide CompiledKernel for one distinct kernel of a split program."""
    part = _SHARED_PARTS.get(chunk.key)
    if part is None:
        part = _SHARED_PARTS[chunk.key] = compile_single(chunk)
    return part


class SplitKernel:
    """A split program: a plain-Python driver calling its shared jitted kernels in order.

    Duck-types CompiledKernel (fn, source, compiled, compile_seconds, llvm_ir, program):
    `fn` is the driver. Before the first call the driver calls each kernel through its
    CompiledKernel (which compiles or loads it, and rebuilds a damaged disk entry); after
    it, straight into the jitted functions."""

    def __init__(self, program):
        self.program = program
        self.source = program.source
        self.parts = [shared_part(c) for c in program.chunks]
        digest = hashlib.sha256(program.driver.encode()).hexdigest()[:12]
        self.filename = f"<hybridnet-driver-{digest}>"
        linecache.cache[self.filename] = (len(program.driver), None,
                                          program.driver.splitlines(True), self.filename)
        self._namespace = dict(program.globals)
        self._namespace.setdefault("np", np)
        self._bind(direct=False)
        exec(compile(program.driver, self.filename, "exec"), self._namespace)  # noqa: S102
        self.fn = self._namespace[program.entry]
        self.compile_seconds = 0.0
        self.compiled = False

    def _bind(self, direct):
        for j, part in enumerate(self.parts):
            self._namespace[f"c{j}"] = part.fn if direct else part

    def __call__(self, *arrays):
        if self.compiled:
            return self.fn(*arrays)
        start = time.perf_counter()
        out = with_blas_threads(self.fn, self.program)(*arrays)
        blas.configure()
        self.compile_seconds = time.perf_counter() - start
        self._bind(direct=True)
        self.compiled = True
        self.fn = with_blas_threads(self.fn, self.program)
        return out

    @property
    def from_disk(self) -> bool:
        """Were all kernels taken from the disk cache?"""
        return all(p.from_disk for p in self.parts)

    @property
    def cache_hits(self) -> int:
        """Kernel signatures Numba loaded from its disk cache instead of compiling."""
        return sum(p.cache_hits for p in self.parts)

    @property
    def llvm_ir(self) -> str:
        """LLVM IR of every kernel (empty before the first call)."""
        return "\n".join(f"; ---- kernel c{j}\n{p.llvm_ir}" for j, p in enumerate(self.parts))

    def __repr__(self) -> str:
        return (f"<SplitKernel {len(self.parts)} kernels, {self.filename} "
                f"compiled={self.compiled}>")
