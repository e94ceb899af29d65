"""The llvm engine: machine code from an LLProgram (compiler.lowering.llvm_emit), cached
on disk so that a new process loads it without LLVM.

Compiling: the IR is parsed, optimized at O3 by LLVM's new pass manager with loop and
SLP vectorization for the host CPU (no unrolling, see `_optimize`), and turned into
position-independent object code by the target machine. Where a linker (`ld`) is found,
the object becomes a shared library that ctypes loads, and the library goes to the disk
cache (runtime.objcache); otherwise the object is loaded into one process-wide MCJIT
engine and cached as an object. The cache key (`graph_key`) is computed from the graph,
before lowering: a warm process imports neither llvmlite.ir nor llvmlite.binding, and
reads the kernel's calling convention from the entry's record. Only this module and
compiler.lowering.llvm_* import llvmlite; nothing here imports Numba.
"""

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from compiler.lowering import llvm_program
from compiler.lowering.llvm_program import CALL, LLProgram

from .llvm_kernel import LLVMKernel, kernel_class, program_digest
from .objcache import OBJECTS, key_of

_STATE = {}
CALL_SUFFIX = "_c"  # hn_call's symbol: the entry's, with this suffix
# LLVM's state is global and llvmlite releases the GIL inside it: one compile at a time
# (threads that trace at once crashed in LLVM without it).
_LOCK = threading.RLock()


def _llvmlite_lock():
    """llvmlite's own lock around its C API (one per process), once it is imported."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    return getattr(getattr(getattr(ffi, "lib", None), "_lock", None), "_lock", None)


def _before_fork():
    """Wait for a compile another thread runs, and hold LLVM's locks across the fork: a
    child forked in the middle of one inherited them held by a thread it does not have,
    and its next compile hung (review). The child gets LLVM's state between compiles."""
    _LOCK.acquire()
    lock = _llvmlite_lock()
    if lock is not None:
        lock.acquire()
    _FORK_HELD.append(lock)


def _after_fork():
    lock = _FORK_HELD.pop() if _FORK_HELD else None
    if lock is not None:
        lock.release()
    _LOCK.release()


_FORK_HELD = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                        after_in_child=_after_fork)
_HERE = os.path.dirname(os.path.abspath(__file__))
_CODE_FILES = [os.path.join(_HERE, f) for f in ("llvm_engine.py", "llvm_kernel.py",
                                                "objcache.py")]


def _llvm():
    """llvmlite.binding, initialized once, with the host target machine and the engine."""
    with _LOCK:
        return _init_llvm()


def _init_llvm():
    if "llvm" not in _STATE:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic")
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        _STATE.update(llvm=llvm, tm=tm, engine=engine, triple=target.triple)
    return _STATE


# ---- the cache key, without llvmlite -------------------------------------------------------


def host_cpu() -> str:
    """The CPU as the key sees it: model and feature flags (from /proc/cpuinfo; where
    that is missing, from LLVM)."""
    if "cpu" not in _STATE:
        text = ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith(("model name", "flags", "Features", "CPU part")):
                        text += line
                    if line.strip() == "" and text:
                        break
        except OSError:
            pass
        if not text:
            llvm = _llvm()["llvm"]
            text = llvm.get_host_cpu_name() + llvm.get_host_cpu_features().flatten()
        _STATE["cpu"] = f"{platform.machine()} {text}"
    return _STATE["cpu"]


def code_version() -> str:
    """A hash of the code the kernels depend on (the compiler package: IR, passes, fusion,
    lowering; this engine) and the llvmlite version: kernels cached by another version
    of any of them are never loaded."""
    if "code" not in _STATE:
        import llvmlite  # (the package alone: ~1 ms)

        root = os.path.dirname(os.path.dirname(os.path.abspath(llvm_program.__file__)))
        files = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names
                       if f.endswith(".py"))
        h = hashlib.sha256(llvmlite.__version__.encode())
        for path in files + _CODE_FILES:
            with open(path, "rb") as f:
                h.update(f.read())
        _STATE["code"] = h.hexdigest()
    return _STATE["code"]


def vector_width() -> int:
    """The vector width loops are vectorized for: 512 bits where the CPU has AVX-512
    (LLVM's Intel default is 256), HYBRIDNET_VECTOR_WIDTH to choose."""
    raw = os.environ.get("HYBRIDNET_VECTOR_WIDTH", "").strip()
    if raw.isdigit():
        return int(raw)
    return 512 if " avx512f " in f" {host_cpu()} ".replace("\n", " ") else 0


def strength_reduction() -> bool:
    """Does machine code generation run LLVM's loop strength reduction? Not by default:
    it took 0.24 of 1.72 s of a 2-layer LSTM training step's LLVM time, and the step's
    kernel ran as fast without it (45.4 against 44.7 ms, alternating in one process),
    as did an RNN's (0.403 against 0.400 ms), bit for bit. HYBRIDNET_LLVM_LSR=1 runs it."""
    return os.environ.get("HYBRIDNET_LLVM_LSR", "").strip() == "1"


def _codegen() -> str:
    """The settings that change machine code, for the cache keys."""
    return f"width={vector_width()} lsr={strength_reduction()} linker={bool(_linker())}"


def graph_key(graph) -> str:
    """The disk-cache key of the kernel for an optimized graph."""
    return key_of(graph.structural_hash(exact_shapes=True), code_version(), host_cpu(),
                  _codegen())


def _linker():
    if "ld" not in _STATE:
        _STATE["ld"] = shutil.which("ld")
    return _STATE["ld"]


# ---- loading -----------------------------------------------------------------------------


def load_cached(graph, units, key) -> LLVMKernel:
    """The kernel for `graph` from the disk cache (a shared library), or None."""
    return _load_library(key, lambda meta: LLProgram.from_meta(meta, graph, units))


def _load_library(key, program_of):
    """The kernel stored under `key` (a shared library), or None; `program_of(record's
    meta)` gives its program or raises (a damaged or foreign entry is then removed)."""
    start = time.perf_counter()
    found = OBJECTS.get_library(key) if _linker() else None
    if found is None:
        return None
    record, path = found
    try:
        program = program_of(record["meta"])
        lib = ctypes.CDLL(path)
        address = _symbols(lib, f"hn_{program_digest(program)}")
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        OBJECTS.discard_library(key, f"{type(exc).__name__}: {exc}")
        return None
    return kernel_class(program)(program, address, {"load": time.perf_counter() - start},
                                 from_disk=True, keep=lib)


def _symbols(lib, symbol) -> tuple:
    """(hn_entry's, hn_call's) addresses in a loaded library."""
    return tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                 for name in (symbol, symbol + CALL_SUFFIX))


# ---- compiling ---------------------------------------------------------------------------


def _tuned(text) -> str:
    """The functions with the host's preferred vector width (a string attribute
    llvmlite.ir cannot spell; on every function, since the parts are called from one
    another)."""
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
    # (O2 took as long on a language model's 14,500-line training step: 2.0-2.1 s of LLVM
    # either way, in alternating runs)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    # No unrolling: LLVM fully unrolls the small constant-trip loops exact shapes give
    # (10 rows of an LSTM step...), which made O3 ten times slower on a 20-step LSTM and
    # the kernels no faster (the vectorizer still interleaves).
    pto.loop_unrolling = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def _emit_object(llvm, tm, mod) -> bytes:
    """Machine code for `mod`, without loop strength reduction unless asked for
    (strength_reduction()). The option is LLVM's, process-wide (Numba shares it), so it
    is set for this call only, then put back to LLVM's default (llvmlite cannot read an
    option: another LLVM user's own -disable-lsr=true is not kept; only speed differs)."""
    if strength_reduction():
        return tm.emit_object(mod)
    llvm.set_option("", "-disable-lsr=true")
    try:
        return tm.emit_object(mod)
    finally:
        llvm.set_option("", "-disable-lsr=false")


def _link(obj, folder) -> bytes:
    """A shared library made of one object file (None when linking fails)."""
    src, lib = os.path.join(folder, "k.o"), os.path.join(folder, "k.so")
    with open(src, "wb") as f:
        f.write(obj)
    proc = subprocess.run([_linker(), "-shared", "-o", lib, src], capture_output=True)
    if proc.returncode:
        return None
    with open(lib, "rb") as f:
        return f.read()


def compile_symbolic(program) -> LLVMKernel:
    """A kernel for every length (compiler.lowering.llvm_sym), from the disk cache when an
    earlier process compiled the same program (its record must equal this program's),
    else compiled now and stored. The key is the program's IR and record, so lowering
    comes first; only LLVM is saved."""
    meta = json.dumps(program.to_meta(), sort_keys=True)
    key = key_of("symbolic", meta, code_version(), host_cpu(), _codegen())

    def same_program(record_meta):
        if json.dumps(record_meta, sort_keys=True) != meta:
            raise ValueError("the record is another program's")
        return program
    loaded = _load_library(key, same_program)
    return loaded or compile_llvm(program, key if _linker() else None)


def compile_llvm(program, key) -> LLVMKernel:
    """Compile an LLProgram, cache it on disk under `key` and load it."""
    with _LOCK:
        return _compile(program, key)


def _compile(program, key) -> LLVMKernel:
    if not _linker() and key is not None:
        cached = _from_object(program, key)
        if cached is not None:
            return cached
    st = _llvm()
    llvm, tm = st["llvm"], st["tm"]
    symbol = f"hn_{program_digest(program)}"
    t0 = time.perf_counter()
    text = program.source.replace(f'@"{program.entry}"', f'@"{symbol}"')
    mod = llvm.parse_assembly(_tuned(text.replace(f'@"{CALL}"', f'@"{symbol}{CALL_SUFFIX}"')))
    mod.triple, mod.data_layout = st["triple"], str(tm.target_data)
    mod.verify()
    t1 = time.perf_counter()
    _optimize(mod, tm)
    t2 = time.perf_counter()
    optimized = str(mod)
    obj = _emit_object(llvm, tm, mod)
    t3 = time.perf_counter()
    phases = {"llvm_parse": t1 - t0, "llvm_optimize": t2 - t1, "machine_code": t3 - t2}
    kernel = _as_library(program, key, obj, symbol, phases, optimized) if _linker() else None
    if kernel is not None:
        return kernel
    if key is not None:
        OBJECTS.put(key, obj)
    t4 = time.perf_counter()
    address = _loaded(st["engine"], llvm, symbol, obj)
    phases["load"] = time.perf_counter() - t4
    return kernel_class(program)(program, address, phases, optimized_ir=optimized)


def _from_object(program, key):
    """Without a linker: the kernel from a cached object file (MCJIT), or None."""
    t0 = time.perf_counter()
    obj = OBJECTS.get(key)
    if obj is None:
        return None
    st = _llvm()
    address = _loaded(st["engine"], st["llvm"], f"hn_{program_digest(program)}", obj)
    return LLVMKernel(program, address, {"load": time.perf_counter() - t0}, from_disk=True)


def _as_library(program, key, obj, symbol, phases, optimized):
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hn-link-") as tmp:
        data = _link(obj, tmp)
        if data is None:
            return None
        # (key None: a kernel for symbolic lengths, not kept on disk)
        path = None if key is None else OBJECTS.put_library(key, data, program.to_meta())
        if path is None:  # (no disk cache: a private copy of the library)
            path = os.path.join(tempfile.mkdtemp(prefix="hn-lib-"), "k.so")
            with open(path, "wb") as f:
                f.write(data)
            lib = ctypes.CDLL(path)
            os.unlink(path)  # (the mapping stays)
            os.rmdir(os.path.dirname(path))
        else:
            lib = ctypes.CDLL(path)
    address = _symbols(lib, symbol)
    phases["link_and_load"] = time.perf_counter() - t0
    return kernel_class(program)(program, address, phases, optimized_ir=optimized, keep=lib)


_LOADED = {}  # (symbol, call) -> address(es): an object is added to the engine once


def _loaded(engine, llvm, symbol, obj, call=True):
    """The address of `symbol` in an object added to the MCJIT engine, with hn_call's
    (a tuple) when `call`."""
    key = (symbol, call)
    address = _LOADED.get(key)
    if address is None:
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        names = (symbol, symbol + CALL_SUFFIX) if call else (symbol,)
        address = tuple(engine.get_function_address(name) for name in names)
        if not all(address):
            raise RuntimeError(f"llvm engine: {symbol} not found in its object code")
        address = address if call else address[0]
        _LOADED[key] = address
    return address
