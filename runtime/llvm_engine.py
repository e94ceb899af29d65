"""The llvm engine: machine code from an LLProgram (compiler.lowering.llvm_emit), called
through one C-ABI entry per traced call.

The IR is parsed, optimized at O3 by LLVM's new pass manager with loop and SLP
vectorization for the host CPU (`llvm.get_host_cpu_name()` and its features), turned
into object code by the target machine, and loaded into one process-wide MCJIT engine.
The object code goes to the disk cache (runtime.objcache) on the way, so the next
process loads it without parsing or optimizing anything. A call gathers the buffer
pointers of its arrays (inputs checked for shape and dtype and made C-contiguous,
outputs and one scratch arena allocated with NumPy) into one pointer array and calls
`hn_entry(bufs, fns)` with ctypes; `fns` holds SciPy's BLAS ?gemm pointers
(`scipy.linalg.cython_blas`), so the object code names no address of this process.
Only this module and compiler.lowering.llvm_* import llvmlite; nothing here imports
Numba.
"""

import ctypes
import hashlib
import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from compiler import blas

from .objcache import OBJECTS, key_of

_STATE = {}
_ALIGN = 64


def _llvm():
    """llvmlite.binding, initialized once, with the host target machine and the engine."""
    if not _STATE:
        import llvmlite
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(cpu=cpu, features=features, opt=3)
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        _STATE.update(llvm=llvm, tm=tm, engine=engine, triple=target.triple,
                      versions=f"llvmlite={llvmlite.__version__} llvm="
                               f"{'.'.join(map(str, llvm.llvm_version_info))}",
                      cpu=f"{cpu} {features}")
    return _STATE


def _own_version() -> str:
    try:
        from importlib import metadata
        return metadata.version("hybridnet")
    except Exception:  # noqa: BLE001  (a source checkout has no metadata)
        return "dev"


def vector_width() -> int:
    """The vector width loops are vectorized for: 512 bits where the CPU has AVX-512
    (LLVM's Intel default is 256), HYBRIDNET_VECTOR_WIDTH to choose."""
    raw = os.environ.get("HYBRIDNET_VECTOR_WIDTH", "").strip()
    if raw.isdigit():
        return int(raw)
    return 512 if "+avx512f" in _llvm()["cpu"] else 0


def _tuned(text) -> str:
    """The kernel functions with the host's preferred vector width (a string attribute
    llvmlite.ir cannot spell; on the entry too, which the kernel is inlined into)."""
    width = vector_width()
    if not width:
        return text
    out, at = [], 0
    while True:
        start = text.find("\ndefine ", at)
        if start < 0:
            break
        end = text.index(")", text.index("(", start)) + 1  # (no nested parentheses)
        out.append(text[at:end] + f' "prefer-vector-width"="{width}"')
        at = end
    return "".join(out) + text[at:]


def _optimize(mod, tm):
    llvm = _STATE["llvm"]
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    # No unrolling: LLVM fully unrolls the small constant-trip loops exact shapes give
    # (10 rows of an LSTM step...), which made O3 ten times slower on a 20-step LSTM and
    # the kernels no faster (the vectorizer still interleaves).
    pto.loop_unrolling = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def _gemm_pointers(names):
    """Addresses of SciPy's Fortran BLAS routines, by name."""
    if not names:
        return []
    from scipy.linalg import cython_blas

    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    out = []
    for name in names:
        capsule = cython_blas.__pyx_capi__[name]
        out.append(get_ptr(capsule, get_name(capsule)))
    blas.configure()  # (SciPy's BLAS is loaded now: one thread, as compiler.blas says)
    return out


_ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                               ctypes.c_int64)
_POOL = []  # the worker threads parallel kernels share (created at the first one)
PIECES_PER_THREAD = 4  # rows are handed out in this many pieces per thread


def threads() -> int:
    """Threads a parallel kernel uses: HYBRIDNET_THREADS, else the CPUs this process may
    run on (2 here): the caller plus threads() - 1 workers, never more."""
    raw = os.environ.get("HYBRIDNET_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _pool(n):
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="hn-llvm"))
    return _POOL[0]


def run_rows(entry, table, fns, rows):
    """entry(table, fns, lo, hi) over rows [0, rows) on threads(): pieces are taken from a
    shared counter, so a thread that waits for a core (a busy neighbour) takes fewer
    pieces instead of holding the others up. ctypes releases the GIL during each call."""
    n = min(threads(), rows)
    if n < 2:
        entry(table, fns, 0, rows)
        return
    pieces = min(rows, n * PIECES_PER_THREAD)
    bounds = [rows * j // pieces for j in range(pieces + 1)]
    counter = itertools.count()

    def work():
        while True:
            j = next(counter)  # (atomic under the GIL)
            if j >= pieces:
                return
            entry(table, fns, bounds[j], bounds[j + 1])
    helpers = [_pool(n).submit(work) for _ in range(n - 1)]
    work()
    for h in helpers:
        h.result()


class LLVMKernel:
    """A compiled LLProgram; call it with the graph's input arrays (like CompiledKernel).

    `phases` holds seconds per compile phase (llvm parse, llvm optimize, machine code,
    load; or load from cache)."""

    def __init__(self, program):
        self.program = program
        self.source = program.source
        self.compiled = True
        self.from_disk = False
        self.compile_seconds = 0.0
        self.phases = {}
        self.filename = ""
        self._build()

    def _build(self):
        st = _llvm()
        llvm, tm = st["llvm"], st["tm"]
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:24]
        symbol = f"hn_{digest}"
        self.filename = f"<hybridnet-llvm-{digest}>"
        key = key_of(self.source, st["versions"], st["cpu"], st["triple"], _own_version(),
                     f"width={vector_width()}")
        obj = OBJECTS.get(key)
        t0 = time.perf_counter()
        if obj is None:
            text = _tuned(self.source.replace(f'@"{self.program.entry}"', f'@"{symbol}"'))
            mod = llvm.parse_assembly(text)
            mod.triple, mod.data_layout = st["triple"], str(tm.target_data)
            mod.verify()
            t1 = time.perf_counter()
            _optimize(mod, tm)
            t2 = time.perf_counter()
            self.optimized_ir = str(mod)
            obj = tm.emit_object(mod)
            t3 = time.perf_counter()
            OBJECTS.put(key, obj)
            self.phases.update(llvm_parse=t1 - t0, llvm_optimize=t2 - t1,
                               machine_code=t3 - t2)
        else:
            self.from_disk = True
            self.optimized_ir = None
        t4 = time.perf_counter()
        engine = st["engine"]
        address = _loaded(engine, llvm, symbol, obj)
        self.phases["load"] = time.perf_counter() - t4
        self.compile_seconds = sum(self.phases.values())
        self._entry = _ENTRY_TYPE(address)
        self._fns = np.array(_gemm_pointers(self.program.fns) or [0], dtype=np.uintp)
        self._prepare_layout()

    def _prepare_layout(self):
        p = self.program
        offsets, at = [], 0
        for nbytes in p.temps:
            offsets.append(at)
            at += -(-nbytes // _ALIGN) * _ALIGN
        self._temp_offsets, self._arena = offsets, at + _ALIGN
        self._inputs = [(tuple(s), d) for s, d in p.inputs]
        self._outputs = [(tuple(s), d) for s, d in p.outputs]
        self._consts = [c.__array_interface__["data"][0] for c in p.consts]
        self._fns_address = self._fns.__array_interface__["data"][0]
        self._large = bool(p.large_products)
        self._rows = int(getattr(p, "split_rows", 0))
        self.fn = self.__call__

    def __call__(self, *arrays):
        if len(arrays) != len(self._inputs):
            raise TypeError(f"compiled kernel {self.filename}: {len(arrays)} inputs, "
                            f"expected {len(self._inputs)}")
        ptrs = []
        keep = []
        for a, (shape, dtype) in zip(arrays, self._inputs):
            if a.shape != shape or a.dtype != dtype:
                raise ValueError(f"compiled kernel {self.filename}: input {dtype}"
                                 f"{list(shape)} got {a.dtype}{list(a.shape)}")
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
                keep.append(a)
            ptrs.append(a.__array_interface__["data"][0])
        ptrs += self._consts
        outs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
        ptrs += [o.__array_interface__["data"][0] for o in outs]
        if self._temp_offsets:
            arena = np.empty(self._arena, np.uint8)
            base = arena.__array_interface__["data"][0]
            base += -base % _ALIGN
            ptrs += [base + off for off in self._temp_offsets]
        table = np.array(ptrs, dtype=np.uintp)
        if self.program.uses_blas:
            blas.kernel_threads(self._large)
        address = table.__array_interface__["data"][0]
        if self._rows:
            run_rows(self._entry, address, self._fns_address, self._rows)
        else:
            self._entry(address, self._fns_address, 0, 0)
        return outs[0] if self.program.single_output else tuple(outs)

    @property
    def llvm_ir(self) -> str:
        """The optimized IR when compiled here; the emitted IR when loaded from the disk
        cache (the object code holds no IR)."""
        return self.optimized_ir or self.source

    @property
    def cache_hits(self) -> int:
        return int(self.from_disk)

    def __repr__(self) -> str:
        return f"<LLVMKernel {self.filename} from_disk={self.from_disk}>"


_LOADED = {}  # symbol -> address (an object is added to the engine once per process)


def _loaded(engine, llvm, symbol, obj) -> int:
    address = _LOADED.get(symbol)
    if address is None:
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        address = engine.get_function_address(symbol)
        if not address:
            raise RuntimeError(f"llvm engine: {symbol} not found in its object code")
        _LOADED[symbol] = address
    return address


def compile_llvm(program) -> LLVMKernel:
    """Compile (or load from the disk cache) an LLProgram."""
    return LLVMKernel(program)
