"""Shape and movement ops: reshape, permute, squeeze, expand, cat, stack, split, ..."""

import builtins

import numpy as np

from compiler.errors import ShapeError

from ._state import STATE, note_clamp
from .dispatch import apply, cast, promote
from .dtypes import to_np
from .tensor import Tensor, make, share_version, version_counter


def _shape_args(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def _view(name: str, t, attrs) -> Tensor:
    """Apply a movement op; when NumPy returned a view, share the version counter."""
    return share_version(apply(name, (t,), attrs), t)


def _dim(op, t, dim, extra=0) -> int:
    n = t.ndim + extra
    lim = builtins.max(n, 1)
    if not -lim <= dim < lim:
        raise ShapeError(f"{op}: dim {dim} is out of range for a tensor of shape "
                         f"{list(t.shape)} (expected {-lim}..{lim - 1})")
    return dim % lim


def reshape(input, *shape):
    """Reshape (one dim may be -1); a view when the layout allows."""
    shape = _shape_args(shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: only one dim may be -1, got {list(shape)}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        total = input._data.size
        if known == 0 or total % known:
            raise ShapeError(f"reshape: cannot reshape {input.dtype}{list(input.shape)} "
                             f"into {list(shape)}")
        shape = tuple(total // known if s == -1 else s for s in shape)
    return _view("reshape", input, {"shape": shape})


view = reshape


def flatten(input, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim into one."""
    if input.ndim == 0:
        return reshape(input, 1)
    s, e = _dim("flatten", input, start_dim), _dim("flatten", input, end_dim)
    if s > e:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = input.shape[:s] + (int(np.prod(input.shape[s:e + 1])),) + input.shape[e + 1:]
    return reshape(input, shape)


def permute(input, *dims):
    """Reorder dims (a view)."""
    dims = tuple(_dim("permute", input, d) for d in _shape_args(dims))
    if sorted(dims) != list(range(input.ndim)):
        raise ShapeError(f"permute: {list(dims)} is not a permutation of the dims of "
                         f"{input.dtype}{list(input.shape)}")
    return _view("permute", input, {"dims": dims})


def transpose(input, dim0, dim1):
    """Swap two dims (a view)."""
    if input.ndim < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return input
    d0, d1 = _dim("transpose", input, dim0), _dim("transpose", input, dim1)
    dims = list(range(input.ndim))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(input, *dims)


def t_property(input):
    """`t.T`: reverse the dims."""
    return permute(input, *reversed(range(input.ndim))) if input.ndim >= 2 else input


def unsqueeze(input, dim):
    """Insert a size-1 dim at `dim`."""
    d = _dim("unsqueeze", input, dim, extra=1)
    return reshape(input, input.shape[:d] + (1,) + input.shape[d:])


def squeeze(input, dim=None):
    """Remove size-1 dims (all, or the given dim or dims; others are left as they are)."""
    if dim is None:
        dims = {i for i, s in enumerate(input.shape) if s == 1}
    else:
        raw = (dim,) if isinstance(dim, int) else tuple(dim)
        dims = {_dim("squeeze", input, d) for d in raw}
        dims = {d for d in dims if d < input.ndim and input.shape[d] == 1}
    return reshape(input, tuple(s for i, s in enumerate(input.shape) if i not in dims))


def expand(input, *sizes):
    """Broadcast to `sizes` (-1 keeps a dim); a read-only view."""
    sizes = _shape_args(sizes)
    lead = len(sizes) - input.ndim
    if lead < 0:
        raise ShapeError(f"expand: cannot expand {input.dtype}{list(input.shape)} to "
                         f"{list(sizes)} (fewer dims)")
    shape = tuple(input.shape[i - lead] if s == -1 and i >= lead else s
                  for i, s in enumerate(sizes))
    return _view("expand", input, {"shape": shape})


def broadcast_to(input, shape):
    """hn.broadcast_to(t, shape): as expand."""
    return expand(input, *_shape_args((shape,)))


def contiguous(input):
    """A tensor whose values are laid out contiguously (self if already so)."""
    if input._data.flags.c_contiguous:
        return input
    return input * 1 if input._data.dtype.kind != "b" else apply(
        "where", (input, np.bool_(True), np.bool_(False)))


def clone(input):
    """A copy that owns its memory (gradients flow through it)."""
    if input._data.dtype.kind == "b":
        return apply("where", (input, np.bool_(True), np.bool_(False)))
    return input + input._data.dtype.type(0)


def cat(tensors, dim=0):
    """Concatenate along an existing dim."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("cat: expected a non-empty list of tensors")
    tensors = promote("cat", tensors)
    d = _dim("cat", tensors[0], dim)
    return apply("cat", tuple(tensors), {"dim": d})


concat = cat


def stack(tensors, dim=0):
    """Stack along a new dim."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("stack: expected a non-empty list of tensors")
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise ShapeError(f"stack: all tensors must have the same shape, got "
                         f"{[list(t.shape) for t in tensors]}")
    d = _dim("stack", tensors[0], dim, extra=1)
    return cat([unsqueeze(t, d) for t in tensors], d)


def _slice_dim(input, d, start, stop) -> Tensor:
    index = tuple((start, stop, 1) if i == d else (0, s, 1) for i, s in enumerate(input.shape))
    return _view("slice", input, {"index": index})


def split(input, split_size_or_sections, dim=0):
    """Split into chunks of a given size, or of the given list of sizes."""
    if input.ndim == 0:
        raise ShapeError("split: expected a tensor with at least 1 dim, got a 0-d tensor")
    d = _dim("split", input, dim)
    size = input.shape[d]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step <= 0:
            raise ValueError(f"split: split_size must be positive, got {step}")
        sizes = [builtins.min(step, size - i) for i in range(0, size, step)] or [0]
        if size % step:  # (the last piece cut short: decided from the size)
            note_clamp(size)
    else:
        sizes = list(split_size_or_sections)
        if builtins.sum(sizes) != size:
            raise ShapeError(f"split: sizes {sizes} do not add up to {size} (dim {dim} of "
                             f"{list(input.shape)})")
    out, start = [], 0
    for s in sizes:
        out.append(_slice_dim(input, d, start, start + s))
        start += s
    return tuple(out)


def chunk(input, chunks, dim=0):
    """Split into `chunks` pieces of equal size (the last may be smaller)."""
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    if input.ndim == 0:
        raise ShapeError("chunk: expected a tensor with at least 1 dim, got a 0-d tensor")
    size = input.shape[_dim("chunk", input, dim)]
    step = -(-size // chunks) if size else 1
    if chunks > 1:  # (the pieces' size is decided from the dim's)
        note_clamp(size)
    return split(input, step, dim)


def to(input, dtype):
    """Convert to `dtype` (returns self when it already has it)."""
    return cast(input, to_np(dtype))


def detach(input):
    """The same values with no history (shares memory and version counter)."""
    if STATE.recorders:  # keep the dataflow visible to recording and tracing
        t = apply("detach", (input,))
    else:
        t = make(input._data)
    t._vc = version_counter(input)
    return t
