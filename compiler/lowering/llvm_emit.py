"""Lower an optimized graph to one LLVM IR module for the llvm backend.

The module exports `void hn_entry(i8** bufs, i8** fns)`: `bufs` holds one pointer per
buffer -- the graph inputs (0-d ones as 1-element arrays), array constants, the outputs
(allocated by the caller), then the temporaries (slices of one scratch arena) -- and `fns`
the BLAS routines the kernel calls (SciPy's `cython_blas` sgemm/dgemm), so the object code
holds no address of this process and can be cached on disk. `hn_entry` passes them to
`hn_kernel`, whose buffer parameters are `noalias`: outputs and temporaries are fresh
memory, inputs are only read. Fused `LoopGroup`s become loop nests
(compiler.lowering.llvm_groups); views (reshape, permute, slice) are strides, not copies;
matmul calls BLAS; cat and pad_slice are copy loops. Shapes are the traced ones: the
backend compiles exact shapes (`shape_generic=False`). An op or dtype with no rule raises
LoweringError, and the trace takes the Numba backend instead (compiler.lowering.llvm_emit
is pure Python: its output is testable as text).
"""

import contextlib
import math

import numpy as np
from llvmlite import ir

from ..errors import LoweringError
from ..ir import pad_shape as _pad
from ..passes.fusion import LoopGroup, partition
from . import llvm_scalar as S
from .llvm_arena import FOREVER
from .llvm_arena import plan as plan_arena
from .llvm_buf import I8P, I32, I64, Buf, contiguous
from .llvm_call import emit_call, emit_refusing_call
from .llvm_groups import LLGroup
from .llvm_nodes import NODE_RULES
from .llvm_program import (
    ENTRY,
    LLProgram,
    array_consts,
    check_llvm_supported,
    loop_const_starts,
)

GEMM = {np.dtype(np.float32): "sgemm", np.dtype(np.float64): "dgemm"}


class _Kernel:
    """One emission of hn_kernel. The alias scopes of its accesses are set after it
    (`apply_scopes`), once the arena plan knows which temporaries share bytes."""

    def __init__(self, graph, units, module=None, prefix="hn", fn_names=None):
        self.graph, self.units = graph, units
        self.users = graph.users()
        self.outputs = {id(o) for o in graph.outputs}
        self.module = ir.Module(name="hybridnet") if module is None else module
        self.prefix = prefix
        self.consts = array_consts(graph)
        self.fn_names = [] if fn_names is None else fn_names  # (shared with loop bodies)
        self.bodies = {}  # LoopSpec key -> llvm_loop.Body emitted into this module
        self.const_starts = loop_const_starts(graph)
        self.sub_emitter = _emit_into
        # the buffer table, the BLAS pointers, the rows [lo, hi) of dim 0 a parallel kernel
        # runs (a part loads the pointers it uses: a parameter per buffer made LLVM's
        # interprocedural passes quadratic in the graph size)
        fnty = ir.FunctionType(ir.VoidType(), [I8P.as_pointer(), I8P.as_pointer(), I64, I64])
        self.fnty = fnty
        self.kernel = self._function(f"{prefix}_kernel")
        self.kernel_b = ir.IRBuilder(self.kernel.append_basic_block("entry"))
        self.parts = 0
        self.fn = self.b = self.alloca_block = None
        self._ptrs = {}
        self.bufs = {}
        self.split = 0  # rows of dim 0 the threads share (0: one thread, all rows)
        self.serial_only = False  # emitted code outside the row loops (no split then)
        self.claimed = set()
        self._status = None
        self.temps = []
        self._first_temp = len(graph.inputs) + len(self.consts) + len(graph.outputs)
        self.unit = 0  # the unit being emitted (lifetimes of temporaries: llvm_arena)
        self.lives = []  # per temporary: [unit that made it, last unit that used it]
        self.groups = None  # per temporary: its arena group (None: one each)
        self._scoped = []  # (part function, its accesses) for apply_scopes

    # -- buffers ---------------------------------------------------------------------------

    @property
    def n_bufs(self) -> int:
        """Slots of the buffer table: inputs, constants, outputs, temporaries."""
        return self._first_temp + len(self.temps)

    def _function(self, name):
        fn = ir.Function(self.module, self.fnty, name)
        fn.linkage = "internal"
        return fn

    # -- kernel parts: the units are emitted into functions of about PART_BUDGET
    # instructions each (LLVM's optimization time grows faster than linearly with the size
    # of one function); hn_kernel calls them in order

    def begin_part(self):
        self.fn = self._function(f"{self.prefix}_part{self.parts}")
        self.fn.attributes.add("noinline")
        self.parts += 1
        self.alloca_block = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.b = ir.IRBuilder(self.fn.append_basic_block("body"))
        self._ptrs = {}
        self._accesses = []  # (load or store, buffer slot)

    def end_part(self):
        self.b.ret_void()
        self.alloca_block.branch(self.fn.blocks[1])
        self._scoped.append((self.fn, self._accesses))
        self.kernel_b.call(self.fn, list(self.kernel.args))
        self.fn = None

    def part_size(self) -> int:
        return sum(len(block.instructions) for block in self.fn.blocks)

    def pointer(self, buf):
        """The typed pointer of `buf`'s slot in the function being emitted."""
        key = (buf.slot, buf.dtype)
        if buf.slot >= self._first_temp:
            life = self.lives[buf.slot - self._first_temp]
            life[1] = max(life[1], self.unit)
        found = self._ptrs.get(key)
        if found is None:
            table = self.fn.args[0]
            raw = self.alloca_block.load(self.alloca_block.gep(table, [I64(buf.slot)]))
            found = self._ptrs[key] = self.alloca_block.bitcast(
                raw, S.ir_type(buf.dtype, memory=True).as_pointer())
        return found

    def bind_sources(self):
        g = self.graph
        for k, node in enumerate(g.inputs):
            self.bufs[id(node)] = self._plain(k, node)
        for k, node in enumerate(self.consts):
            self.bufs[id(node)] = self._plain(len(g.inputs) + k, node)

    def _plain(self, k, node):
        shape = _pad(node.shape)
        return Buf(k, np.dtype(node.dtype), shape, contiguous(shape))

    def buffer(self, node) -> Buf:
        found = self.bufs.get(id(node))
        if found is None:
            if node.op == "const":
                return self._const_buffer(node)
            raise LoweringError(f"{node.op}: its value has no buffer in the llvm kernel")
        return found

    def _const_buffer(self, node):
        self.serial_only = True
        buf = self.new_buffer(node)
        self.fill(buf, S.constant(node.attrs["value"], node.dtype))
        return buf

    def new_buffer(self, node, shape=None) -> Buf:
        """A contiguous buffer for `node`: its output slot if it is a graph output not yet
        claimed, else a new temporary."""
        shape = _pad(node.shape if shape is None else shape)
        k = None
        if shape == _pad(node.shape):
            for j, out in enumerate(self.graph.outputs):
                if out is node and j not in self.claimed:
                    self.claimed.add(j)
                    k = len(self.graph.inputs) + len(self.consts) + j
                    break
        if k is None:
            k = self.new_temp(math.prod(shape) * np.dtype(node.dtype).itemsize)
        buf = Buf(k, np.dtype(node.dtype), shape, contiguous(shape))
        self.bufs[id(node)] = buf
        return buf

    def new_temp(self, nbytes) -> int:
        """The slot of a new temporary of `nbytes`."""
        self.temps.append(int(nbytes))
        self.lives.append([self.unit, self.unit])
        return self._first_temp + len(self.temps) - 1

    def status_buf(self) -> Buf:
        """The kernel's status byte (1: an index was out of range; LLProgram.status)."""
        if self._status is None:
            self._status = Buf(self.new_temp(64), np.dtype(np.uint8), (1,), (1,))
            self.lives[-1] = [-1, FOREVER]  # (zeroed before the kernel, read after it)
        return self._status

    def temp_buf(self, shape, dtype) -> Buf:
        shape = _pad(shape)
        slot = self.new_temp(math.prod(shape) * np.dtype(dtype).itemsize)
        return Buf(slot, np.dtype(dtype), shape, contiguous(shape))

    def raw(self, buf, offset=None):
        """`buf`'s first element as an i8* (offset: an extra IR element offset)."""
        at = buf.offset if isinstance(buf.offset, ir.Value) else I64(buf.offset)
        if offset is not None:
            at = self.b.add(at, offset)
        return self.b.bitcast(self.b.gep(self.pointer(buf), [at]), I8P)

    def address(self, buf, at):
        b = self.b
        offset = buf.offset if isinstance(buf.offset, ir.Value) else I64(buf.offset)
        for i, stride in zip(at, buf.strides):
            if i is not None and stride:
                offset = b.add(offset, b.mul(i, I64(stride)) if stride != 1 else i)
        return b.gep(self.pointer(buf), [offset], inbounds=True)

    def load(self, buf, at):
        value = self.b.load(self.address(buf, at), align=buf.dtype.itemsize)
        self._accesses.append((value, buf.slot))
        return S.from_memory(self.b, value, buf.dtype)

    def store(self, buf, at, value):
        op = self.b.store(S.to_memory(self.b, value, buf.dtype), self.address(buf, at),
                          align=buf.dtype.itemsize)
        self._accesses.append((op, buf.slot))

    def _scope(self, slot) -> str:
        """A buffer's alias scope: its slot, or its arena group for a temporary sharing
        bytes with others (llvm_arena)."""
        k = slot - self._first_temp
        if self.groups is not None and 0 <= k < len(self.groups):
            return f"g{self.groups[k]}"
        return f"b{slot}"

    def apply_scopes(self, groups=None):
        """Give every part's accesses their alias scopes; `groups`: per temporary, its
        arena group (llvm_arena.plan; None: a scope per buffer)."""
        self.groups = groups
        for fn, accesses in self._scoped:
            self._alias_scopes(fn, accesses)
        self._scoped = []

    def _alias_scopes(self, fn, accesses):
        """Scoped no-alias metadata on a part's loads and stores: one scope per buffer
        (different buffers never overlap: outputs and temporaries are memory of their own,
        inputs are only read; views share their base's buffer), so LLVM vectorizes without
        run-time overlap checks."""
        slots = sorted({self._scope(slot) for _, slot in accesses})
        if len(slots) < 2:
            return
        m = self.module
        domain = m.add_metadata([ir.MetaDataString(m, f"{fn.name}.buffers")])
        scope = {s: m.add_metadata([ir.MetaDataString(m, f"{fn.name}.{s}"), domain])
                 for s in slots}
        own = {s: m.add_metadata([scope[s]]) for s in slots}
        others = {s: m.add_metadata([scope[o] for o in slots if o != s]) for s in slots}
        for op, slot in accesses:
            name = self._scope(slot)
            op.set_metadata("alias.scope", own[name])
            op.set_metadata("noalias", others[name])

    def alloca(self, ty):
        return self.alloca_block.alloca(ty)

    def rows(self):
        """The (lo, hi) IR values bounding dim 0 of every group in a parallel kernel."""
        return self.fn.args[2], self.fn.args[3]

    @contextlib.contextmanager
    def loop(self, n, start=None):
        """`for i in range(start, n)` (n a constant or an i64 value, start 0 or a value):
        yields the i64 index."""
        b = self.b
        n = n if isinstance(n, ir.Value) else I64(n)
        pre = b.block
        head, body = self.fn.append_basic_block("loop"), self.fn.append_basic_block("body")
        end = self.fn.append_basic_block("done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(I64(0) if start is None else start, pre)
        b.cbranch(b.icmp_signed("<", i, n), body, end)
        b.position_at_end(body)
        yield i
        i.add_incoming(b.add(i, I64(1), flags=("nsw", "nuw")), b.block)
        b.branch(head)
        b.position_at_end(end)

    def each(self, shape, body):
        """body(indices) over every index of `shape` (nested constant loops)."""
        def go(j, idx):
            if j == len(shape):
                body(idx)
                return
            with self.loop(shape[j]) as i:
                go(j + 1, idx + [i])
        go(0, [])

    def fill(self, buf, value):
        self.each(buf.shape, lambda idx: self.store(buf, idx, value))

    def copy(self, dst, src):
        """dst[...] = src[...] elementwise (same shape; converts dtype). Both contiguous,
        of one dtype: one memmove, which compiles to a few instructions where an index
        loop is vectorized with its remainder (a loop's per-step copies made a third of
        an RNN kernel's IR)."""
        if dst.dtype == src.dtype and dst.is_contiguous and src.is_contiguous:
            size = math.prod(dst.shape) * dst.dtype.itemsize
            if size:
                move = self.module.declare_intrinsic("llvm.memmove", [I8P, I8P, I64])
                self.b.call(move, [self.raw(dst), self.raw(src), I64(size),
                                   ir.Constant(ir.IntType(1), 0)])
            return

        def body(idx):
            v = S.convert(self.b, self.load(src, idx), src.dtype, dst.dtype)
            self.store(dst, idx, v)
        self.each(dst.shape, body)

    # -- units -----------------------------------------------------------------------------

    def emit_units(self):
        self.begin_part()
        for i, unit in enumerate(self.units):
            self.unit = i
            if self.part_size() > PART_BUDGET:
                self.end_part()
                self.begin_part()
            if isinstance(unit, LoopGroup):
                LLGroup(self, unit).emit()
                continue
            node = unit.node
            rule = NODE_RULES.get(node.op)
            if rule is None:
                raise LoweringError(f"the llvm backend cannot lower op {node.op!r} yet")
            rule(self, node)

    def emit_outputs(self):
        self.unit = len(self.units)
        base = len(self.graph.inputs) + len(self.consts)
        # (a repeated output of the kernel is the same array, see same_outputs; a loop
        # body writes each of its outputs, which the loop keeps apart)
        same = same_outputs(self.graph) if self.prefix == "hn" else \
            list(range(len(self.graph.outputs)))
        for j, out in enumerate(self.graph.outputs):
            if j in self.claimed or same[j] != j:
                continue
            self.serial_only = True
            shape = _pad(out.shape)
            dst = Buf(base + j, np.dtype(out.dtype), shape,
                      contiguous(shape))
            if out.op == "const" and not np.ndim(out.attrs["value"]):
                self.fill(dst, S.constant(out.attrs["value"], out.dtype))
                continue
            src = self.buffer(out)
            if self.prefix != "hn" and self._same_bytes(dst, src):
                # (a loop may hand its body one block for a value it both carries and
                # collects, llvm_loop._in_block: then there is nothing to copy)
                with self.b.if_then(self.b.icmp_unsigned("!=", self.raw(dst), self.raw(src))):
                    self.copy(dst, src)
            else:
                self.copy(dst, src)

    @staticmethod
    def _same_bytes(dst, src) -> bool:
        """True when `dst` and `src` hold the same bytes if they start at one address
        (both contiguous, one dtype, one size): a copy between them may be skipped."""
        return dst.dtype == src.dtype and dst.is_contiguous and src.is_contiguous and \
            math.prod(dst.shape) == math.prod(src.shape)

    def finish(self):
        self.end_part()
        self.kernel_b.ret_void()

    def fn_slot(self, name):
        """The word `name` holds in `fns` (compiler.blas.scipy_pointers), as an i8*."""
        if name not in self.fn_names:
            self.fn_names.append(name)
        k = self.fn_names.index(name)
        return self.b.load(self.b.gep(self.fn.args[1], [I64(k)]))

    def gemm_fn(self, dtype):
        """The BLAS ?gemm pointer (from `fns`), as a typed function pointer."""
        name = GEMM[np.dtype(dtype)]
        if name not in self.fn_names:
            self.fn_names.append(name)
        k = self.fn_names.index(name)
        t = S.ir_type(dtype).as_pointer()
        ip = I32.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [I8P, I8P, ip, ip, ip, t, t, ip, t, ip, t, t, ip])
        fns = self.fn.args[1]  # (of the part being emitted)
        raw = self.b.load(self.b.gep(fns, [I64(k)]))
        return self.b.bitcast(raw, fnty.as_pointer())


def same_outputs(graph) -> list:
    """Per output, the first output position holding the same node: the kernel returns
    one array for both, as eager returns one tensor (a result that is also a saved value
    must be the same array, so that changing it in place is seen by the backward)."""
    first = {}
    return [first.setdefault(id(o), j) for j, o in enumerate(graph.outputs)]


def _entry(module, kernel_fn, n_bufs):
    fnty = ir.FunctionType(ir.VoidType(), [I8P.as_pointer(), I8P.as_pointer(), I64, I64])
    fn = ir.Function(module, fnty, ENTRY)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.call(kernel_fn, list(fn.args))
    b.ret_void()
    return fn


# Instructions (before optimization) per kernel part.
PART_BUDGET = 400
# Loop nests of at least this many elements in all split their rows across threads.
PARALLEL_ELEMENTS = 1 << 20


def split_rows(units) -> int:
    """N when every unit is a loop group whose domain starts with the same N rows, computed
    row by row (no reduction across dim 0) and big enough to share; else 0. Each thread
    then runs the whole kernel on its rows [lo, hi): a row of every value depends only
    on the same row of its inputs (or a broadcast one)."""
    if not units or not all(isinstance(u, LoopGroup) for u in units):
        return 0
    rows = {u.domain[0] if u.domain else None for u in units}
    if len(rows) != 1 or None in rows or any(u.outer < 1 or u.buffer_reductions
                                             for u in units):
        return 0
    n = rows.pop()
    work = sum(math.prod(u.domain) for u in units)
    if n < 2 or work < PARALLEL_ELEMENTS or not all(_row_aligned(u, n) for u in units):
        return 0
    return n


def _row_aligned(group, n) -> bool:
    """Does every value `group` reads from another group have its rows along dim 0 of the
    group's domain? (A vector of length n computed by another group and broadcast along
    the last dim would be read whole by every thread, while others still write it.)"""
    rank = len(group.domain)
    for node in group.nodes:
        for inp in node.inputs:
            if group.holds(inp) or inp.is_source:
                continue
            shape = _pad(inp.shape)
            if len(shape) != rank or shape[0] != n:
                return False
    return True


def _emit_into(graph, units, module, prefix, fn_names):
    """A loop body's emission (llvm_loop.body_of) into `module`: its temporaries never
    share bytes (a scope per buffer)."""
    k = _Kernel(graph, units, module, prefix, fn_names)
    k.bind_sources()
    k.emit_units()
    k.emit_outputs()
    k.finish()
    k.apply_scopes()
    return k


def _emit(graph, units, split=0):
    k = _Kernel(graph, units)
    k.split = split
    k.bind_sources()
    k.emit_units()
    k.emit_outputs()
    k.finish()
    return k


def first_pass(graph, parallel=True):
    """(units, split, kernel): `graph` emitted once, its temporaries and their lifetimes
    counted, alias scopes not yet set; `parallel=False`: no row split across threads."""
    check_llvm_supported(graph, loops=True)
    units = partition(graph)
    split = split_rows(units) if parallel else 0
    k = _emit(graph, units, split)
    if split and k.serial_only:  # (code outside the row loops: one thread after all)
        split = 0
        k = _emit(graph, units, split)
    return units, split, k


def lower_llvm(graph, first=None, apart=(), call=True) -> LLProgram:
    """The IR module and calling convention for `graph` (an optimized clone); raises
    LoweringError for what the llvm backend cannot lower (the caller falls back).
    `first`: its first_pass, if made already (used up here); `apart`: temporaries that
    share no bytes (llvm_arena.plan); `call=False`: hn_call always refuses (every call
    takes the checked path: kernels for symbolic lengths, compiler.lowering.llvm_sym)."""
    units, split, k = first_pass(graph) if first is None else first
    offsets, groups, arena = plan_arena(k.temps, k.lives, share=not split, apart=apart)
    k.apply_scopes(groups)
    entry = _entry(k.module, k.kernel, k.n_bufs)
    program = LLProgram(
        "", [(_pad(n.shape), np.dtype(n.dtype)) for n in graph.inputs],
        [np.ascontiguousarray(np.asarray(n.attrs["value"], n.dtype)) for n in k.consts],
        [(_pad(n.shape), np.dtype(n.dtype)) for n in graph.outputs], list(k.temps),
        list(k.fn_names), units)
    program.same_as = same_outputs(graph)
    program.temp_offsets, program.arena = offsets, arena
    program.status = -1 if k._status is None else k._status.slot - k._first_temp
    if call:
        emit_call(k.module, entry, program, k.n_bufs, k._first_temp)
    else:
        emit_refusing_call(k.module)
    program.source = str(k.module)
    program.uses_blas = bool(k.fn_names)
    program.single_output = len(graph.outputs) == 1
    program.split_rows = split
    program.parallel = bool(split)
    program.finish()
    program.notes.append(f"llvm: {len(units)} units, {len(k.temps)} temporaries "
                         f"({sum(k.temps)} bytes, in an arena of {arena})")
    return program


__all__ = ["lower_llvm", "first_pass", "LLProgram", "check_llvm_supported", "ENTRY", "Buf",
           "contiguous"]
