"""Primitive reductions, movement/indexing ops and matmul (see `compiler.ops`)."""

import math

import numpy as np

from . import blas
from .errors import DTypeError, ShapeError, describe
from .registry import (
    OpDef,
    Trait,
    broadcast_shapes,
    check_dims,
    reduced_shape,
    register,
    same_dtype,
    sum_to,
)

_RED = frozenset({Trait.REDUCTION, Trait.PURE})
_MOVE = frozenset({Trait.MOVEMENT, Trait.PURE})
_NONE = frozenset()
_IN = frozenset({"in"})
_BOTH = frozenset({"in", "out"})


def _shape_str(shapes, dtypes):
    return describe(shapes, dtypes)


# ---- reductions -----------------------------------------------------------------------


def _reduce_rule(name, nonempty=False):
    def infer(shapes, dtypes, dims, keepdim):
        shape, dt = tuple(shapes[0]), dtypes[0]
        dims = check_dims(name, dims, len(shape), shape, dt)
        if nonempty and any(shape[d] == 0 for d in dims if d < len(shape)):
            raise ShapeError(f"{name}: cannot reduce a size-0 dim of {dt}{list(shape)} "
                             f"over dims {dims} (the result has no identity)")
        return reduced_shape(shape, dims, keepdim), dt
    return infer


def _keep_shape(shape, dims):
    return tuple(1 if i in dims else s for i, s in enumerate(shape))


def _sum_impl(x, dims, keepdim):
    if not keepdim and len(dims) == x.ndim:  # (a whole reduction: axis=None is the fast path)
        return np.asarray(np.add.reduce(x, axis=None, dtype=x.dtype))
    return np.asarray(np.add.reduce(x, axis=dims, dtype=x.dtype, keepdims=keepdim))


def _max_impl(x, dims, keepdim):
    return np.asarray(np.maximum.reduce(x, axis=dims, keepdims=keepdim))


def _min_impl(x, dims, keepdim):
    return np.asarray(np.minimum.reduce(x, axis=dims, keepdims=keepdim))


def _sum_vjp(e, g, x, o, a):
    shape = tuple(x[0].shape)
    g = e("reshape", g, shape=_keep_shape(shape, a["dims"]))
    return e("expand", g, shape=shape)


def _extreme_vjp(e, g, x, o, a):
    # PyTorch's amax/amin: ties share the gradient evenly.
    shape = tuple(x[0].shape)
    keep = _keep_shape(shape, a["dims"])
    mask = e("eq", x[0], e("reshape", o, shape=keep))
    count = e("sum", e("cast", mask, dtype=str(e.dtype(g))), dims=a["dims"], keepdim=True)
    return e("where", mask, e("div", e("reshape", g, shape=keep), count), 0)


register(OpDef("sum", 1, _sum_impl, _reduce_rule("sum"), vjp=(_sum_vjp,),
               attrs=("dims", "keepdim"), traits=_RED, saves=_NONE, combine="add",
               initial="zero",
               doc="sum over `dims` (dtype kept; the tensor layer widens ints first)",
               zeros="first"))
register(OpDef("max", 1, _max_impl, _reduce_rule("max", True), vjp=(_extreme_vjp,),
               attrs=("dims", "keepdim"), traits=_RED, saves=_BOTH, combine="max",
               initial="lowest", doc="amax over `dims`"))
register(OpDef("min", 1, _min_impl, _reduce_rule("min", True), vjp=(_extreme_vjp,),
               attrs=("dims", "keepdim"), traits=_RED, saves=_BOTH, combine="min",
               initial="highest", doc="amin over `dims`"))


def _arg_rule(name):
    def infer(shapes, dtypes, dim, keepdim):
        shape = tuple(shapes[0])
        if dim is None:
            if math.prod(shape) == 0:
                raise ShapeError(f"{name}: empty input {dtypes[0]}{list(shape)}")
            return ((1,) * len(shape) if keepdim else ()), np.dtype(np.int64)
        check_dims(name, (dim,), len(shape), shape, dtypes[0])
        if shape and shape[dim] == 0:
            raise ShapeError(f"{name}: dim {dim} of {dtypes[0]}{list(shape)} has size 0")
        return reduced_shape(shape, (dim,), keepdim), np.dtype(np.int64)
    return infer


def _arg_impl(fn):
    def impl(x, dim, keepdim):
        if x.ndim == 0:
            return np.zeros((), np.int64)
        return np.asarray(fn(x, axis=dim, keepdims=keepdim), dtype=np.int64)
    return impl


for _name, _fn in [("argmax", np.argmax), ("argmin", np.argmin)]:
    register(OpDef(_name, 1, _arg_impl(_fn), _arg_rule(_name), attrs=("dim", "keepdim"),
                   traits=_RED | {Trait.ARG_REDUCTION}, saves=_NONE,
                   doc=f"{_name} (first occurrence), int64"))


# ---- movement ------------------------------------------------------------------------


def _reshape_rule(shapes, dtypes, shape):
    if math.prod(shape) != math.prod(shapes[0]) or any(s < 0 for s in shape):
        raise ShapeError(f"reshape: cannot reshape {_shape_str(shapes, dtypes)} "
                         f"({math.prod(shapes[0])} elements) into shape {list(shape)}")
    return tuple(shape), dtypes[0]


def _permute_rule(shapes, dtypes, dims):
    if sorted(dims) != list(range(len(shapes[0]))):
        raise ShapeError(f"permute: dims {list(dims)} are not a permutation of the dims of "
                         f"{_shape_str(shapes, dtypes)}")
    return tuple(shapes[0][d] for d in dims), dtypes[0]


def _expand_rule(shapes, dtypes, shape):
    src = tuple(shapes[0])
    lead = len(shape) - len(src)
    if lead < 0 or any(s != 1 and s != t for s, t in zip(src, shape[lead:])):
        raise ShapeError(f"expand: cannot expand {_shape_str(shapes, dtypes)} to {list(shape)}")
    return tuple(shape), dtypes[0]


def _outer_wins(outer, inner):
    """reshape/expand of a reshape/expand: only the last target shape matters."""
    return outer


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


register(OpDef("reshape", 1, lambda x, shape: np.reshape(x, shape), _reshape_rule,
               vjp=(lambda e, g, x, o, a: e("reshape", g, shape=tuple(x[0].shape)),),
               attrs=("shape",), traits=_MOVE, saves=_NONE, doc="reshape (a view if possible)",
               compose=_outer_wins, noop_same_type=True, zeros="first", regroups=True))
register(OpDef("permute", 1, lambda x, dims: np.transpose(x, dims), _permute_rule,
               vjp=(lambda e, g, x, o, a: e("permute", g, dims=_inverse(a["dims"])),),
               attrs=("dims",), traits=_MOVE, saves=_NONE, doc="reorder dims (a view)",
               compose=lambda outer, inner: {"dims": tuple(inner["dims"][d]
                                                           for d in outer["dims"])},
               is_identity=lambda a: tuple(a["dims"]) == tuple(range(len(a["dims"]))),
               swaps_last_two=lambda a: len(a["dims"]) >= 2 and tuple(a["dims"]) == tuple(
                   range(len(a["dims"]) - 2)) + (len(a["dims"]) - 1, len(a["dims"]) - 2),
               zeros="first"))
register(OpDef("expand", 1, lambda x, shape: np.broadcast_to(x, shape), _expand_rule,
               vjp=(lambda e, g, x, o, a: sum_to(e, g, x[0].shape),),
               attrs=("shape",), traits=_MOVE | {Trait.BROADCAST}, saves=_NONE,
               doc="broadcast to `shape` (a read-only view)", compose=_outer_wins,
               noop_same_type=True, zeros="first"))


register(OpDef("detach", 1, lambda x: x, lambda shapes, dtypes: (tuple(shapes[0]), dtypes[0]),
               traits=_MOVE | {Trait.BROADCAST}, saves=_NONE,
               doc="identity that stops gradients (recorded only inside hn.record / tracing)",
               zeros="first"))


def _slices(index):
    return tuple(slice(start, stop, step) for start, stop, step in index)


def _slice_rule(shapes, dtypes, index):
    shape = tuple(shapes[0])
    if len(index) != len(shape):
        raise ShapeError(f"slice: index has {len(index)} entries for {_shape_str(shapes, dtypes)}")
    out = []
    for (start, stop, step), size in zip(index, shape):
        if step <= 0 or not (0 <= start <= size and 0 <= stop <= size):
            raise ShapeError(f"slice: bad range {start}:{stop}:{step} for a dim of size {size}")
        out.append(len(range(start, stop, step)))
    return tuple(out), dtypes[0]


def _pad_slice_rule(shapes, dtypes, shape, index):
    want, _ = _slice_rule([shape], dtypes, index)
    if want != tuple(shapes[0]):
        raise ShapeError(f"pad_slice: source {_shape_str(shapes, dtypes)} does not fill "
                         f"region {index} of {list(shape)}")
    return tuple(shape), dtypes[0]


def _pad_slice_impl(x, shape, index):
    out = np.zeros(shape, dtype=x.dtype)
    out[_slices(index)] = x
    return out


register(OpDef("slice", 1, lambda x, index: x[_slices(index)], _slice_rule,
               vjp=(lambda e, g, x, o, a: e("pad_slice", g, shape=tuple(x[0].shape),
                                            index=a["index"]),),
               attrs=("index",), traits=_MOVE, saves=_NONE, noop_same_type=True,
               window="read",
               doc="basic slicing: `index` holds (start, stop, step) per dim, step > 0",
               zeros="first"))
register(OpDef("pad_slice", 1, _pad_slice_impl, _pad_slice_rule,
               vjp=(lambda e, g, x, o, a: e("slice", g, index=a["index"]),),
               attrs=("shape", "index"), traits=_MOVE, saves=_NONE, noop_same_type=True,
               window="write",
               doc="zeros of `shape` with the input written at `index` (slice's vjp)",
               zeros="first"))


def _cat_rule(shapes, dtypes, dim):
    if not shapes:
        raise ShapeError("cat: expected a non-empty list of tensors")
    dt = same_dtype("cat", shapes, dtypes)
    first = tuple(shapes[0])
    if not first:
        raise ShapeError(f"cat: zero-dimensional tensors cannot be concatenated, got "
                         f"{_shape_str(shapes, dtypes)}")
    check_dims("cat", (dim,), len(first), first, dt)
    for s in shapes[1:]:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first))
                                       if i != dim):
            raise ShapeError(f"cat: sizes must match except in dim {dim}, got "
                             f"{_shape_str(shapes, dtypes)}")
    size = sum(s[dim] for s in shapes)
    return first[:dim] + (size,) + first[dim + 1:], dt


def _cat_vjp(e, g, xs, o, a):
    dim, start, grads = a["dim"], 0, []
    full = [(0, s, 1) for s in g.shape]
    for x in xs:
        stop = start + x.shape[dim]
        index = list(full)
        index[dim] = (start, stop, 1)
        grads.append(e("slice", g, index=tuple(index)))
        start = stop
    return tuple(grads)


register(OpDef("cat", -1, lambda *xs, dim: np.concatenate(xs, axis=dim), _cat_rule,
               vjp=_cat_vjp, attrs=("dim",), traits=_MOVE, saves=_NONE, joins=True,
               doc="concatenate along `dim`", zeros="all"))


def _take_rule(shapes, dtypes, dim):
    (xs, ixs), (xd, ixd) = shapes, dtypes
    if ixd.kind not in "iu":
        raise DTypeError(f"take: indices must be integers, got {_shape_str(shapes, dtypes)}")
    check_dims("take", (dim,), len(xs), xs, xd)
    return tuple(xs[:dim]) + tuple(ixs) + tuple(xs[dim + 1:]), xd


def _take_impl(x, idx, dim):
    size = x.shape[dim]
    if idx.size and (idx.max() >= size or idx.min() < -size):
        bad = idx.max() if idx.max() >= size else idx.min()
        raise IndexError(f"index {bad} is out of bounds for dim {dim} with size {size}")
    return np.take(x, idx, axis=dim)


def _scatter_add_rule(shapes, dtypes, dim, size):
    (ss, ixs), (sd, ixd) = shapes, dtypes
    if ixd.kind not in "iu":
        raise DTypeError(f"scatter_add: indices must be integers, got {_shape_str(shapes, dtypes)}")
    k = len(ixs)
    if tuple(ss[dim:dim + k]) != tuple(ixs):
        raise ShapeError(f"scatter_add: source dims {dim}..{dim + k} must match the index "
                         f"shape, got {_shape_str(shapes, dtypes)}")
    return tuple(ss[:dim]) + (size,) + tuple(ss[dim + k:]), sd


def _scatter_add_impl(src, idx, dim, size):
    out = np.zeros(src.shape[:dim] + (size,) + src.shape[dim + idx.ndim:], dtype=src.dtype)
    np.add.at(out, (slice(None),) * dim + (idx,), src)
    return out


register(OpDef("take", 2, _take_impl, _take_rule,
               vjp=(lambda e, g, x, o, a: e("scatter_add", g, x[1], dim=a["dim"],
                                            size=x[0].shape[a["dim"]]), None),
               attrs=("dim",), traits=_MOVE, saves=_IN,
               doc="gather: x.take(idx) along `dim` (negative indices wrap)",
               zeros="first"))
register(OpDef("scatter_add", 2, _scatter_add_impl, _scatter_add_rule,
               vjp=(lambda e, g, x, o, a: e("take", g, x[1], dim=a["dim"]), None),
               attrs=("dim", "size"), traits=frozenset({Trait.PURE}), saves=_IN,
               doc="zeros with `size` along `dim`, src added at idx (take's vjp)",
               zeros="first"))


# ---- matmul --------------------------------------------------------------------------


def _matmul_rule(shapes, dtypes):
    (a, b) = shapes
    dt = same_dtype("matmul", shapes, dtypes)
    if dt.kind == "b":
        raise DTypeError(f"matmul: not supported on bool inputs ({_shape_str(shapes, dtypes)})")
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ShapeError(f"matmul: shapes cannot be multiplied: {_shape_str(shapes, dtypes)} "
                         f"(inner sizes {a[-1:]} vs {b[-2:-1]})")
    batch = broadcast_shapes("matmul", [a[:-2], b[:-2]], dtypes)
    return batch + (a[-2], b[-1]), dt


def _swap_last(e, x):
    n = len(x.shape)
    return e("permute", x, dims=tuple(range(n - 2)) + (n - 1, n - 2))


def _matmul(a, b):
    if a.dtype.kind == "b" or b.dtype.kind == "b":  # as the rule says (NumPy would allow it)
        raise TypeError("matmul is not supported on bool inputs")
    return blas.matmul(a, b)


register(OpDef("matmul", 2, _matmul, _matmul_rule,
               vjp=(lambda e, g, x, o, a: sum_to(e, e("matmul", g, _swap_last(e, x[1])),
                                                 x[0].shape),
                    lambda e, g, x, o, a: sum_to(e, e("matmul", _swap_last(e, x[0]), g),
                                                 x[1].shape)),
               traits=frozenset({Trait.PURE}), saves=_IN, transpose_swaps=True, product=True,
               doc="batched matrix product; both inputs have ndim >= 2", zeros="any"))
