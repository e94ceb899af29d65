"""The llvm backend's rules for ops that are not fused into loops: views are strides over
their source's buffer (no copy), matmul calls BLAS ?gemm through a function pointer, cat
and pad_slice are copy loops. Each rule binds `em.bufs[id(node)]` (llvm_emit._Kernel).
"""

import math

from llvmlite import ir

from .. import blas
from ..errors import LoweringError
from ..ir import pad_shape as _pad
from . import llvm_scalar as S
from .llvm_argreduce import argreduce, cumsum
from .llvm_buf import I32, I64, Buf, contiguous
from .llvm_gather import scatter_add, take
from .llvm_loop import emit_loop
from .llvm_window import fold, unfold


def _view(em, node, shape, strides, offset):
    src = em.buffer(node.inputs[0])
    em.bufs[id(node)] = Buf(src.slot, src.dtype, _pad(shape), tuple(strides), offset)


def _contiguous_source(em, node):
    """The input's buffer, copied first when it is a strided view."""
    src = em.buffer(node)
    if src.is_contiguous:
        return src
    tmp = em.new_buffer(node, src.shape)
    em.copy(tmp, src)
    em.bufs[id(node)] = src  # (other readers keep the view)
    return tmp


def _reshape(em, node):
    src = _contiguous_source(em, node.inputs[0])
    shape = _pad(node.shape)
    em.bufs[id(node)] = Buf(src.slot, src.dtype, shape, contiguous(shape), src.offset)


def _permute(em, node):
    src = em.buffer(node.inputs[0])
    dims = tuple(node.attrs["dims"])
    if not len(node.shape):
        em.bufs[id(node)] = src
        return
    _view(em, node, [src.shape[d] for d in dims], [src.strides[d] for d in dims], src.offset)


def _slice(em, node):
    src = em.buffer(node.inputs[0])
    index = node.attrs["index"]
    if not len(node.shape):
        em.bufs[id(node)] = src
        return
    offset = src.offset + sum(a * st for (a, _, _), st in zip(index, src.strides))
    strides = [st * c for (_, _, c), st in zip(index, src.strides)]
    _view(em, node, node.shape, strides, offset)


def _pad_slice(em, node):
    out = em.new_buffer(node)
    em.fill(out, S.constant(0, node.dtype))
    index = node.attrs["index"]
    offset = sum(a * st for (a, _, _), st in zip(index, out.strides))
    region = Buf(out.slot, out.dtype, _pad(node.inputs[0].shape),
                 tuple(st * c for (_, _, c), st in zip(index, out.strides)), offset)
    em.copy(region, em.buffer(node.inputs[0]))


def _cat(em, node):
    out = em.new_buffer(node)
    dim, at = node.attrs["dim"], 0
    for x in node.inputs:
        n = x.shape[dim]
        region = Buf(out.slot, out.dtype, _pad(x.shape), out.strides,
                     out.offset + at * out.strides[dim])
        em.copy(region, em.buffer(x))
        at += n


# ---- matmul through BLAS ---------------------------------------------------------------


def _operand(em, node):
    """(buffer, transposed) of a 2-D matmul operand BLAS can read: C-contiguous, or the
    transpose of a C-contiguous matrix (x @ W.T); anything else is copied."""
    buf = em.buffer(node)
    rows, cols = buf.shape
    if buf.strides == (cols, 1) or cols == 1 and buf.strides[0] == 1:
        return buf, False
    if buf.strides == (1, rows):
        return buf, True
    return _contiguous_source(em, node), False


def _gemm(em, dtype, m, n, k, a, a_t, b, b_t, c, offs=None):
    """C[m,n] = A[m,k] @ B[k,n] (row-major) as the column-major C^T = B^T A^T; `offs`:
    the (a, b, c) element offsets as IR values (default: the buffers' own)."""
    bld, ty = em.b, S.ir_type(dtype)

    def slot(value, of=I32):
        p = em.alloca(of)
        bld.store(value if isinstance(value, ir.Constant) else of(value), p)
        return p

    def char(ch):
        return slot(ord(ch), ir.IntType(8))

    offs = offs or (I64(a.offset), I64(b.offset), I64(c.offset))
    pa, pb, pc = (bld.gep(em.pointer(buf), [o]) for buf, o in zip((a, b, c), offs))
    wide = _threads_on(em, m, n, k)
    bld.call(em.gemm_fn(dtype), [
        char("T" if b_t else "N"), char("T" if a_t else "N"), slot(n), slot(m), slot(k),
        slot(ir.Constant(ty, 1.0), ty), pb, slot(k if b_t else n), pa, slot(m if a_t else k),
        slot(ir.Constant(ty, 0.0), ty), pc, slot(n)])
    _threads_off(em, wide)


_SET_THREADS = ir.FunctionType(ir.VoidType(), [I32])


def _threads_on(em, m, n, k):
    """Before a product: BLAS's threads when it is large (m * n * k multiply-adds of at
    least compiler.blas.LARGE_MACS, decided at run time: a symbolic length's kernel is
    one text), as eager threads only large products. Its small products stay on one
    thread, which a busy neighbour cannot stall. `fns` holds the setter (null: no
    switching) and the count (compiler.blas.scipy_pointers). Returns (setter, large)."""
    bld = em.b
    setter = em.fn_slot(blas.SET_THREADS)
    count = bld.ptrtoint(em.fn_slot(blas.THREADS), I64)
    macs = bld.mul(bld.mul(I64(m), I64(n)), I64(k))
    large = bld.and_(bld.icmp_signed(">=", macs, I64(blas.LARGE_MACS)),
                     bld.icmp_unsigned("!=", bld.ptrtoint(setter, I64), I64(0)))
    fn = bld.bitcast(setter, _SET_THREADS.as_pointer())
    with bld.if_then(large):
        bld.call(fn, [bld.trunc(count, I32)])
    return fn, large


def _threads_off(em, wide):
    fn, large = wide
    with em.b.if_then(large):
        em.b.call(fn, [I32(1)])


def _matmul(em, node):
    a_node, b_node = node.inputs
    if node.dtype.kind != "f" or a_node.dtype != node.dtype or b_node.dtype != node.dtype:
        raise LoweringError(f"matmul on {node.dtype} is run eagerly by the llvm backend")
    if len(a_node.shape) < 2 or len(b_node.shape) < 2:
        raise LoweringError("matmul with a 1-d operand: the llvm backend leaves it to numba")
    k = a_node.shape[-1]
    if max(math.prod(node.shape), k) >= 2 ** 31 - 1:
        raise LoweringError("matmul larger than 32-bit BLAS sizes")
    out = em.new_buffer(node)
    m, n = node.shape[-2], node.shape[-1]
    if len(a_node.shape) == 2 and len(b_node.shape) == 2:
        a, a_t = _operand(em, a_node)
        b, b_t = _operand(em, b_node)
        _gemm(em, node.dtype, m, n, k, a, a_t, b, b_t, out)
        return
    if len(b_node.shape) == 2 and len(a_node.shape) == len(node.shape):
        # (batch..., m, k) @ (k, n): one product over all the rows
        a = _contiguous_source(em, a_node)
        b, b_t = _operand(em, b_node)
        rows = math.prod(a_node.shape[:-1])
        _gemm(em, node.dtype, rows, n, k, a, False, b, b_t, out)
        return
    _batched(em, node, out, m, n, k)


def _batched(em, node, out, m, n, k):
    """One ?gemm per item of the broadcast batch dims (operands copied contiguous)."""
    a_node, b_node = node.inputs
    batch = node.shape[:-2]
    a, b = _contiguous_source(em, a_node), _contiguous_source(em, b_node)

    def offsets(buf, idx):
        rank = len(buf.shape) - 2
        off = I64(buf.offset)
        for j in range(rank):
            i = idx[len(batch) - rank + j]
            if buf.shape[j] != 1:
                off = em.b.add(off, em.b.mul(i, I64(buf.strides[j])))
        return off

    def body(idx):
        _gemm(em, node.dtype, m, n, k, a, False, b, False, out,
              (offsets(a, idx), offsets(b, idx), offsets(out, idx)))
    em.each(batch, body)


def _loop(em, node):
    emit_loop(em, node, em.sub_emitter)


NODE_RULES = {"reshape": _reshape, "permute": _permute, "slice": _slice,
              "pad_slice": _pad_slice, "cat": _cat, "matmul": _matmul, "loop": _loop,
              "loop_out": lambda em, node: None,  # (the loop binds its outputs)
              "take": take, "scatter_add": scatter_add, "unfold": unfold, "fold": fold,
              "argmax": argreduce, "argmin": argreduce, "cumsum": cumsum}

__all__ = ["NODE_RULES"]
