"""take (gather) and scatter_add in the llvm backend: loops over (before, index, after)
blocks of contiguous buffers. An index out of range does not read or write: it sets the
kernel's status byte, and the caller raises IndexError as eager does (the status buffer
is `LLProgram.status`; a loop body has none, so these ops there go to numba)."""

import math

import numpy as np
from llvmlite import ir

from ..errors import LoweringError
from . import llvm_scalar as S
from .llvm_buf import I64, Buf


def _flat(em, node) -> Buf:
    """The node's buffer as one contiguous 1-d array (copied first when strided)."""
    buf = em.buffer(node)
    if not buf.is_contiguous:
        tmp = em.temp_buf(buf.shape, buf.dtype)
        em.copy(tmp, buf)
        buf = tmp
    n = math.prod(buf.shape)
    return Buf(buf.slot, buf.dtype, (n,), (1,), buf.offset)


def _index(em, idx, q, n):
    """(wrapped index, in range?) of idx[q] for a dim of size n."""
    b = em.b
    k = S.convert(b, em.load(idx, [q]), idx.dtype, np.dtype(np.int64))
    k = b.select(b.icmp_signed("<", k, I64(0)), b.add(k, I64(n)), k)
    ok = b.and_(b.icmp_signed(">=", k, I64(0)), b.icmp_signed("<", k, I64(n)))
    return k, ok


def _flag(em):
    status = em.status_buf()
    em.b.store(ir.Constant(ir.IntType(8), 1),
               em.b.bitcast(em.raw(status), ir.IntType(8).as_pointer()))


def _check(em):
    if em.prefix != "hn":
        raise LoweringError("take/scatter_add inside a loop body: numba runs it")


def _blocks(shape, dim):
    before = math.prod(shape[:dim])
    after = math.prod(shape[dim + 1:])
    return before, shape[dim], after


def _each(em, a, bsz, body):
    """body(p, r) over the (before, after) blocks around the indexed dim."""
    with em.loop(a) as p:
        with em.loop(bsz) as r:
            body(p, r)


def _at(b, p, mid, k, bsz, r):
    """The flat offset of element (p, k, r) in a (before, mid, after) block layout."""
    return b.add(b.mul(b.add(b.mul(p, I64(mid)), k), I64(bsz)), r)


def _indexed(em, idx, m, n, found, missing):
    """For each index q of idx: found(q, k) when it is in range for a dim of size n, else
    missing(q) after setting the status byte."""
    with em.loop(m) as q:
        k, ok = _index(em, idx, q, n)
        with em.b.if_else(ok) as (then, otherwise):
            with then:
                found(q, k)
            with otherwise:
                _flag(em)
                missing(q)


def _flat_out(em, node):
    out = em.new_buffer(node)
    return out, Buf(out.slot, out.dtype, (math.prod(out.shape),), (1,), out.offset)


def take(em, node):
    _check(em)
    src_node, idx_node = node.inputs
    a, n, bsz = _blocks(tuple(src_node.shape), node.attrs["dim"])
    x, idx = _flat(em, src_node), _flat(em, idx_node)
    m = idx.shape[0] if len(idx_node.shape) else 1
    out, flat = _flat_out(em, node)
    b = em.b

    def found(q, k):
        _each(em, a, bsz, lambda p, r: em.store(flat, [_at(b, p, m, q, bsz, r)],
                                                em.load(x, [_at(b, p, n, k, bsz, r)])))

    def missing(q):  # (defined values, never read: the call raises)
        zero = S.constant(0, out.dtype)
        _each(em, a, bsz, lambda p, r: em.store(flat, [_at(b, p, m, q, bsz, r)], zero))
    _indexed(em, idx, m, n, found, missing)


def scatter_add(em, node):
    _check(em)
    src_node, idx_node = node.inputs
    dim, size = node.attrs["dim"], node.attrs["size"]
    out, flat = _flat_out(em, node)
    em.fill(out, S.constant(0, node.dtype))
    a, _, bsz = _blocks(tuple(node.shape), dim)
    src, idx = _flat(em, src_node), _flat(em, idx_node)
    m = idx.shape[0] if len(idx_node.shape) else 1
    b = em.b

    def add(p, r, q, k):
        at = _at(b, p, size, k, bsz, r)
        total = S.RULES["add"](b, [em.load(flat, [at]),
                                   em.load(src, [_at(b, p, m, q, bsz, r)])], node, em)
        em.store(flat, [at], total)

    _indexed(em, idx, m, size, lambda q, k: _each(em, a, bsz, lambda p, r: add(p, r, q, k)),
             lambda q: None)
