"""Scans and orderings: `cumsum` (a running sum along one dim) and `argsort` (the
stable order of one dim, int64, no gradient). sort/topk/cumprod-free code builds on them
(hybridnet.tensor_ops): a sort's values are a gather at argsort's indices, so their
gradient flows through take."""

import numpy as np

from .errors import DTypeError
from .registry import OpDef, Trait, check_dims, register

_PURE = frozenset({Trait.PURE})
_NONE = frozenset()


def _cumsum_rule(shapes, dtypes, dim):
    shape, dt = tuple(shapes[0]), dtypes[0]
    check_dims("cumsum", (dim,), len(shape), shape, dt)
    if dt.kind == "b":
        raise DTypeError(f"cumsum: bool input {dt}{list(shape)}: convert to an integer first")
    return shape, dt


def _cumsum_impl(x, dim):
    if x.ndim == 0:
        return x.copy()
    return np.cumsum(x, axis=dim, dtype=x.dtype)


def _cumsum_vjp(e, g, x, o, a):
    # d/dx_i of sum_j g_j * sum_{k<=j} x_k = sum_{j>=i} g_j = total - cumsum(g)_i + g_i
    dim = a["dim"]
    if not len(g.shape):
        return g
    total = e("sum", g, dims=(dim,), keepdim=True)
    return e("add", e("sub", total, e("cumsum", g, dim=dim)), g)


register(OpDef("cumsum", 1, _cumsum_impl, _cumsum_rule, vjp=(_cumsum_vjp,), attrs=("dim",),
               traits=_PURE, saves=_NONE, zeros="first",
               doc="running sum along `dim` (dtype kept; the tensor layer widens ints)"))


def _argsort_rule(shapes, dtypes, dim, descending):
    shape = tuple(shapes[0])
    check_dims("argsort", (dim,), len(shape), shape, dtypes[0])
    return shape, np.dtype(np.int64)


def argsort_impl(x, dim, descending):
    """Stable: equal values keep their order; NaN sorts as the largest value (last
    ascending, first descending), as PyTorch."""
    if x.ndim == 0:
        return np.zeros((), np.int64)
    if not descending:
        return np.argsort(x, axis=dim, kind="stable").astype(np.int64)
    n = x.shape[dim]
    flipped = np.flip(x, axis=dim)
    order = np.argsort(flipped, axis=dim, kind="stable")  # ties: later originals first
    return np.ascontiguousarray(np.flip(n - 1 - order, axis=dim)).astype(np.int64)


register(OpDef("argsort", 1, argsort_impl, _argsort_rule, attrs=("dim", "descending"),
               traits=_PURE, saves=_NONE,
               doc="the stable sorting order along `dim`, int64 (no gradient)"))
