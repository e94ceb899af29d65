"""argmax / argmin in the llvm backend: for each (before, after) block around the
reduced dim, a scan keeping the first extreme, as NumPy: the first NaN wins and ends
the search (compiler.lowering.node_rules._argreduce is the numba twin)."""

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
