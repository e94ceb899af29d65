"""argmax / argmin and cumsum in the llvm backend: for each (before, after) block around
the dim, a scan: keeping the first extreme, as NumPy (the first NaN wins and ends the
search; compiler.lowering.node_rules._argreduce is the numba twin), or a running sum."""

import math

import numpy as np

from . import llvm_scalar as S
from .llvm_buf import I64
from .llvm_gather import _at, _flat, _flat_out

_BETTER = {"argmax": ">", "argmin": "<"}


def _blocks(node):
    shape, dim = tuple(node.inputs[0].shape), node.attrs["dim"]
    if dim is None or not shape:
        return 1, max(math.prod(shape), 1), 1
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def _better(b, c, m, symbol, dtype):
    """Does candidate c replace the running extreme m?"""
    if dtype.kind == "f":
        take = b.or_(b.fcmp_ordered(symbol, c, m), b.fcmp_unordered("!=", c, c))
        return b.and_(take, b.fcmp_ordered("==", m, m))  # (a NaN found ends the search)
    signed = dtype.kind == "i"
    return (b.icmp_signed if signed else b.icmp_unsigned)(symbol, c, m)


def argreduce(em, node):
    a, n, bsz = _blocks(node)
    src = node.inputs[0]
    x, dtype = _flat(em, src), np.dtype(src.dtype)
    _, flat = _flat_out(em, node)
    b, symbol = em.b, _BETTER[node.op]
    best = em.alloca(S.ir_type(dtype))
    where = em.alloca(I64)
    with em.loop(a) as p:
        with em.loop(bsz) as r:
            b.store(em.load(x, [_at(b, p, n, I64(0), bsz, r)]), best)
            b.store(I64(0), where)
            with em.loop(I64(n), start=I64(1)) as q:
                c = em.load(x, [_at(b, p, n, q, bsz, r)])
                with b.if_then(_better(b, c, b.load(best), symbol, dtype)):
                    b.store(c, best)
                    b.store(q, where)
            em.store(flat, [b.add(b.mul(p, I64(bsz)), r)], b.load(where))


def cumsum(em, node):
    """out[p, q, r] = out[p, q - 1, r] + x[p, q, r], in order (as NumPy's cumsum)."""
    src = node.inputs[0]
    shape, dim = tuple(src.shape), node.attrs["dim"]
    a = math.prod(shape[:dim]) if shape else 1
    n = shape[dim] if shape else 1
    bsz = math.prod(shape[dim + 1:]) if shape else 1
    x = _flat(em, src)
    _, flat = _flat_out(em, node)
    b = em.b
    total = em.alloca(S.ir_type(np.dtype(node.dtype)))
    with em.loop(a) as p:
        with em.loop(bsz) as r:
            first = em.load(x, [_at(b, p, n, I64(0), bsz, r)])
            b.store(first, total)
            em.store(flat, [_at(b, p, n, I64(0), bsz, r)], first)
            with em.loop(I64(n), start=I64(1)) as q:
                at = _at(b, p, n, q, bsz, r)
                value = S.RULES["add"](b, [b.load(total), em.load(x, [at])], node, em)
                b.store(value, total)
                em.store(flat, [at], value)
