"""Calling llvm-compiled kernels: one ctypes call per traced call, and the threads that
share a big kernel's rows.

The fast path is `hn_call(arrays, static)` (compiler.lowering.llvm_call): the inputs,
the outputs and one scratch arena (allocated with NumPy) go in as one tuple, and machine
code checks each input (exact ndarray, dtype, sizes, C-contiguous, aligned) and gathers
the buffer pointers, using object-layout words verified once on live objects
(`fast_layout`; HYBRIDNET_FAST_CALL=0 turns it off). An input it refuses, and every call
of a kernel that splits rows across threads, take the checked path: pointers gathered in
Python (`hn_entry(bufs, fns, lo, hi)`), inputs converted or rejected with an error naming
the kernel, shapes and dtypes. `fns` holds SciPy's BLAS ?gemm pointers
(`scipy.linalg.cython_blas`), so the machine code names no address of this process.
ctypes releases the GIL during the call.
"""

import ctypes
import hashlib
import itertools
import os
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from compiler import blas
from compiler.lowering.llvm_arena import ALIGN
from compiler.lowering.llvm_sym import evaluate_layout
from compiler.thread_choice import KernelChooser, choose_threads


def program_digest(program) -> str:
    """The name part of a program's entry symbol: a hash of its IR."""
    return hashlib.sha256(program.source.encode()).hexdigest()[:24]


ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
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


_BLAS_KERNELS = weakref.WeakSet()  # live kernels whose function table switches threads


def rebind_blas() -> None:
    """After hn.set_num_threads: every live kernel's table gets the new thread count (one
    thread: no switching, no choosing)."""
    for kernel in list(_BLAS_KERNELS):
        kernel.rebind_blas()


def _forget_pool():
    """In a forked child: the parent's worker threads do not exist here."""
    _POOL.clear()


def reset_pool() -> None:
    """Let the worker threads go; the next parallel kernel starts a pool of threads()."""
    for pool in _POOL:
        pool.shutdown(wait=False)
    _POOL.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


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


def _outputs(alloc) -> list:
    """Output arrays: a new one per (shape, dtype), the same array for an index."""
    outs = []
    for a in alloc:
        outs.append(outs[a] if isinstance(a, int) else np.empty(*a))
    return outs


class _Refused(Exception):
    """hn_call refused an input (its status -1): the checked path takes the call."""


def _accepted(call, items, address) -> int:
    status = call(items, address)
    if status < 0:
        raise _Refused
    return status


CALL_TYPE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.py_object, ctypes.c_void_p)
_LAYOUT = []  # [header words or None], verified once


def fast_layout():
    """The object layout words of hn_call's table (compiler.lowering.llvm_call), read
    from and checked against live objects of this Python and NumPy; None when anything
    disagrees (another Python build, a NumPy whose arrays differ): kernels then gather
    their pointers in Python."""
    if not _LAYOUT:
        _LAYOUT.append(_verified_layout())
    return _LAYOUT[0]


def _verified_layout():
    word = ctypes.sizeof(ctypes.c_void_p)
    if word != 8 or sys.implementation.name != "cpython" or \
            os.environ.get("HYBRIDNET_FAST_CALL", "1") == "0":
        return None  # (id() is an object's address in CPython only)
    c_order = np.zeros((3, 5), np.float32)
    strided = c_order[:, ::2]
    pair = (c_order, strided)
    type_at, items_at, data_at, nd_at, dims_at, descr_at, flags_at = 8, 24, 16, 24, 32, 56, 64
    mask = 0x0001 | 0x0100  # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED

    def read(obj, at, ctype):
        return ctype.from_address(id(obj) + at).value
    try:
        ok = (read(pair, items_at, ctypes.c_void_p) == id(c_order)
              and read(pair, items_at + word, ctypes.c_void_p) == id(strided)
              and all(read(a, type_at, ctypes.c_void_p) == id(np.ndarray) for a in pair)
              and all(read(a, data_at, ctypes.c_void_p) == a.ctypes.data for a in pair)
              and all(read(a, nd_at, ctypes.c_int) == a.ndim for a in pair)
              and all(read(a, descr_at, ctypes.c_void_p) == id(a.dtype) for a in pair)
              and read(c_order, flags_at, ctypes.c_int) & mask == mask
              and not read(strided, flags_at, ctypes.c_int) & 0x0001)
        dims = read(strided, dims_at, ctypes.c_void_p)
        ok = ok and [ctypes.c_int64.from_address(dims + 8 * d).value for d in range(2)] == [3, 3]
    except (ValueError, OSError):
        ok = False
    return [type_at, id(np.ndarray), items_at, data_at, nd_at, dims_at, descr_at,
            flags_at, mask] if ok else None


def _fast_call(kernel):
    """(hn_call as a ctypes function, its static table, the table's address) for
    `kernel`, or Nones."""
    header = fast_layout()
    if header is None or kernel._call_address is None or kernel._rows:
        return None, None, None
    kernel._dtypes = [np.dtype(dtype) for _, dtype in kernel._inputs]  # (kept alive)
    static = np.array(header + [kernel._fns_address] + [id(d) for d in kernel._dtypes] +
                      kernel._consts + kernel._temp_offsets, dtype=np.int64)
    return CALL_TYPE(kernel._call_address), static, static.ctypes.data


class LLVMKernel:
    """A compiled LLProgram at `address` (the hn_entry of its machine code); call it with
    the graph's input arrays (like CompiledKernel). `phases`: seconds per compile phase;
    `from_disk`: loaded from the disk cache; `keep`: what must stay alive for the code
    (the loaded library)."""

    grows = False  # (its sizes are the traced ones)

    def __init__(self, program, address, phases, from_disk=False, optimized_ir=None,
                 keep=None):
        self.program = program
        self.source = program.source
        self.compiled = True
        self.from_disk = from_disk
        self.phases = dict(phases)
        self.compile_seconds = sum(self.phases.values())
        self.optimized_ir = optimized_ir
        self._keep = keep
        self.filename = f"<hybridnet-llvm-{program_digest(program)}>"
        address, call = address if isinstance(address, tuple) else (address, None)
        self._entry = ENTRY_TYPE(address)
        self._call_address = call
        self._fns = np.array(blas.scipy_pointers(program.fns) or [0], dtype=np.uintp)
        self._prepare_layout()
        if blas.SET_THREADS in program.fns:
            _BLAS_KERNELS.add(self)

    def rebind_blas(self):
        """Fill the function table again (hn.set_num_threads changed BLAS's count, or
        whether products switch at all) and start choosing afresh."""
        self._chooser = None
        self._fns[:] = blas.scipy_pointers(self.program.fns) or [0]
        self._prepare_layout()

    def refresh(self):
        """Take the program's settings again (after the backend changed them)."""
        self._prepare_layout()

    def _prepare_layout(self):
        p = self.program
        # (the arena plan, compiler.lowering.llvm_arena; one ALIGN more to align its start)
        self._temp_offsets, self._arena = list(p.temp_offsets), p.arena + ALIGN
        self._inputs = [(tuple(s), d) for s, d in p.inputs]
        self._outputs = [(tuple(s), d) for s, d in p.outputs]
        self._consts = [c.__array_interface__["data"][0] for c in p.consts]
        self._fns_address = self._fns.__array_interface__["data"][0]
        # (refresh() after changing it; a kernel that switches BLAS's threads around each
        # large product itself runs on one thread, compiler.lowering.llvm_nodes)
        slot = p.fns.index(blas.SET_THREADS) if blas.SET_THREADS in p.fns else None
        chooser = getattr(self, "_chooser", None)
        if chooser is not None:  # (its mode may have cleared the setter word)
            self._fns[slot] = chooser.setter
        switches = slot is not None and bool(self._fns[slot])
        self._large = bool(p.large_products) and not switches
        self._rows = int(getattr(p, "split_rows", 0))
        # (a kernel of exact sizes whose BLAS calls are all small never switches: timing
        # its calls would choose between two equal modes, at a few µs a call; a program
        # that does not say, `any_large`, is assumed to switch)
        may_switch = switches and (getattr(p, "any_large", True) or self.grows)
        self._chooser = KernelChooser(self._fns, slot) if may_switch and not self._rows and \
            choose_threads() else None
        self._same = list(p.same_as) or list(range(len(p.outputs)))
        self._status = int(getattr(p, "status", -1))
        self._first_temp = len(p.inputs) + len(p.consts) + len(p.outputs)
        self._call, self._static, self._static_address = _fast_call(self)
        self._alloc = [(shape, dtype) if j == same else same for j, ((shape, dtype), same)
                       in enumerate(zip(self._outputs, self._same))]
        self._plain_outs = self._same == list(range(len(self._outputs)))
        self.fn = self.__call__

    def __call__(self, *arrays):
        call = self._call
        if call is not None and len(arrays) == len(self._inputs):
            outs = [np.empty(shape, dtype) for shape, dtype in self._outputs] \
                if self._plain_outs else _outputs(self._alloc)
            items = arrays + tuple(outs)
            if self._temp_offsets:
                items += (np.empty(self._arena, np.uint8),)
            if self.program.uses_blas:
                blas.kernel_threads(self._large)
            chooser = self._chooser
            if chooser is None:
                status = call(items, self._static_address)
            else:
                try:  # (a call hn_call refuses runs no product: it is no sample)
                    status = chooser.run(_accepted, call, items, self._static_address)
                except _Refused:
                    status = -1
            if status == 0:
                return outs[0] if self.program.single_output else tuple(outs)
            if status > 0:
                raise self._index_error()
        return self._checked(*arrays)  # (-1: an input to check, convert or reject)

    def _checked(self, *arrays):
        if len(arrays) != len(self._inputs):
            raise TypeError(f"compiled kernel {self.filename}: {len(arrays)} inputs, "
                            f"expected {len(self._inputs)}")
        for a, (shape, dtype) in zip(arrays, self._inputs):
            if a.shape != shape or a.dtype != dtype:
                raise ValueError(f"compiled kernel {self.filename}: input {dtype}"
                                 f"{list(shape)} got {a.dtype}{list(a.shape)}")
        return self._run(arrays, self._alloc, self._temp_offsets, self._arena)

    def _run(self, arrays, alloc, offsets, arena_bytes, extra=()):
        """Gather the buffer table in Python (inputs made C-contiguous and aligned, the
        constants, new outputs as `alloc` says, the temporaries at `offsets` of one arena
        of `arena_bytes`, then the words `extra`) and run the kernel on it."""
        ptrs, keep = [], []
        for a in arrays:
            if not (a.flags.c_contiguous and a.flags.aligned):
                a = np.require(a, requirements="CA")
                keep.append(a)
            ptrs.append(a.__array_interface__["data"][0])
        ptrs += self._consts
        outs = _outputs(alloc)
        ptrs += [o.__array_interface__["data"][0] for o in outs]
        if offsets:
            arena = np.empty(arena_bytes, np.uint8)
            base = arena.__array_interface__["data"][0]
            base += -base % ALIGN
            ptrs += [base + off for off in offsets]
        if self._status >= 0:  # (a byte the kernel sets when an index is out of range)
            status = np.zeros(1, np.uint8)
            ptrs[self._first_temp + self._status] = status.__array_interface__["data"][0]
        table = np.array(ptrs + list(extra), dtype=np.uintp)
        if self.program.uses_blas:
            blas.kernel_threads(self._large)
        address = table.__array_interface__["data"][0]
        if self._rows:
            run_rows(self._entry, address, self._fns_address, self._rows)
        elif self._chooser is not None:  # (a SymKernel's time per step of its length)
            self._chooser.run(self._entry, address, self._fns_address, 0, 0,
                              per=extra[0] if extra else 1)
        else:
            self._entry(address, self._fns_address, 0, 0)
        if self._status >= 0 and status[0]:
            raise self._index_error()
        return outs[0] if self.program.single_output else tuple(outs)

    def _index_error(self) -> IndexError:
        return IndexError(f"compiled kernel {self.filename}: an index of take or "
                          "scatter_add is out of range")

    @property
    def threads_choice(self):
        """The ThreadChooser deciding this kernel's BLAS threads by timing (None: its
        products follow the size rule alone, or it has no large product to switch)."""
        return self._chooser

    @property
    def fast(self) -> bool:
        """Does a call gather its buffers in machine code (hn_call, compiler.lowering.
        llvm_call)? False for kernels that split their rows across threads, and where
        this Python's object layout could not be verified."""
        return self._call is not None

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




class SymKernel(LLVMKernel):
    """A kernel for every length (compiler.lowering.llvm_sym): each call reads the length
    n from the input the program names, computes the sizes of every input, output and
    temporary at n, checks the inputs against them and passes n in the buffer table's last
    slot. A length outside the kernel's bounds, or inputs that disagree on it, raise a
    ValueError starting "hn-loop" (the executor runs that call eagerly)."""

    grows = True  # (a longer length than those traced may make a product large)

    def _prepare_layout(self):
        super()._prepare_layout()
        self._call = None  # (every call gathers its pointers here)
        self._layouts = {}  # n -> (inputs, outputs, temporary offsets, arena bytes)

    def __call__(self, *arrays):
        return self._checked(*arrays)

    def length(self, arrays) -> tuple:
        """(n, layout at n) of this call (a ValueError "hn-loop..." when there is none)."""
        p = self.program
        i, d, size = p.sym
        if len(arrays) != len(self._inputs):
            raise TypeError(f"compiled kernel {self.filename}: {len(arrays)} inputs, "
                            f"expected {len(self._inputs)}")
        if np.ndim(arrays[i]) <= d:
            raise ValueError(f"compiled kernel {self.filename}: input {i} has "
                             f"{np.ndim(arrays[i])} dims, its length is dim {d}")
        n, rest = divmod(arrays[i].shape[d] - size.b, size.a)
        if rest or n < p.min_n or (p.max_n is not None and n > p.max_n):
            raise ValueError(f"hn-loop: size {arrays[i].shape[d]} of input {i} gives no "
                             f"length this kernel serves (n >= {p.min_n})")
        layout = self._layouts.get(n)
        if layout is None:
            if len(self._layouts) > 64:
                self._layouts = {}
            layout = self._layouts[n] = evaluate_layout(p, n)
        return n, layout

    def _checked(self, *arrays):
        n, (ins, outs_at, offsets, arena_bytes) = self.length(arrays)
        for k, (a, (shape, dtype)) in enumerate(zip(arrays, ins)):
            if a.dtype != dtype:
                raise ValueError(f"compiled kernel {self.filename}: input {k} {dtype}"
                                 f"{list(shape)} got {a.dtype}{list(a.shape)}")
            if a.shape != shape:
                raise ValueError(f"hn-loop: input {k} is {list(a.shape)}, length {n} needs "
                                 f"{list(shape)}")
        alloc = [(s, d) if j == same else same
                 for j, ((s, d), same) in enumerate(zip(outs_at, self._same))]
        return self._run(arrays, alloc, offsets, arena_bytes + ALIGN, extra=(n,))


def kernel_class(program):
    """The kernel class for a compiled program: SymKernel for one serving every length."""
    return SymKernel if getattr(program, "sym", None) is not None else LLVMKernel
