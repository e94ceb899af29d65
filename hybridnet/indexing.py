"""`t[index]` and `t[index] = value`.

Reading composes primitives: basic slicing (`slice`), then a `reshape` that drops
integer-indexed dims and inserts `None` dims, then at most one gather (`take`)
for integer/bool tensor indices; several index tensors are folded into one linear
index over their dims. As in PyTorch, integers are applied before tensor indices.
"""

import numpy as np

from compiler.errors import ShapeError

from ._state import STATE, TraceHooks, note_clamp, note_untraceable
from .dispatch import apply
from .shape import _view, permute
from .tensor import Tensor, literal, make, share_version, version_counter, wrap


def _as_index_array(x):
    if isinstance(x, Tensor):
        arr = x._data
    else:
        arr = np.asarray(x)
        if arr.dtype.kind == "f" and arr.size == 0:
            arr = arr.astype(np.int64)
    if arr.dtype.kind not in "biu":
        raise IndexError(f"tensors used as indices must be integer or bool, got {arr.dtype}")
    return arr


def _expand_ellipsis(t, index) -> list:
    if not isinstance(index, tuple):
        index = (index,)
    used = sum(1 if not (i is None or i is Ellipsis) else 0 for i in index)
    used += sum(_as_index_array(i).ndim - 1 for i in index
                if _is_array_like(i) and _as_index_array(i).dtype == bool)
    if sum(i is Ellipsis for i in index) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > t.ndim:
        raise IndexError(f"too many indices for tensor of dimension {t.ndim} "
                         f"(shape {list(t.shape)})")
    out = []
    for item in index:
        if item is Ellipsis:
            out.extend([slice(None)] * (t.ndim - used))
        else:
            out.append(item)
    if not any(i is Ellipsis for i in index):
        out.extend([slice(None)] * (t.ndim - used))
    return out


def _is_array_like(x) -> bool:
    return isinstance(x, (Tensor, np.ndarray, list))


def _clamped(item, size) -> bool:
    """Does slice `item` name a bound outside a dim of `size` (which Python clamps), or
    an empty range?"""
    bounds = [b for b in (item.start, item.stop) if b is not None]
    if any(not -size <= int(b) <= size for b in bounds):
        return True
    start, stop, _ = item.indices(size)
    return stop < start


def _parse(t, index):
    """Split index into a slice spec, the final basic shape and advanced indices."""
    if type(index) is int and t.ndim:  # (x[t] in a loop: the common case, kept short)
        size = t.shape[0]
        if -size <= index < size:
            i = index % size
            return ((i, i + 1, 1),) + tuple((0, s, 1) for s in t.shape[1:]), t.shape[1:], []
    items = _expand_ellipsis(t, index)
    spec, shape, adv, dim = [], [], [], 0
    for item in items:
        if item is None:
            shape.append(1)
            continue
        if isinstance(item, (bool, np.bool_)):
            raise IndexError("indexing with a Python bool is not supported")
        if isinstance(item, (int, np.integer)) or (isinstance(item, Tensor) and item.ndim == 0
                                                   and item._data.dtype.kind in "iu"):
            size = t.shape[dim]
            i = int(item)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dim {dim} with size {size} "
                                 f"(tensor shape {list(t.shape)})")
            i %= size
            spec.append((i, i + 1, 1))
            dim += 1
        elif isinstance(item, slice):
            start, stop, step = item.indices(t.shape[dim])
            if step <= 0:
                raise ValueError("step must be greater than zero")
            if STATE.tracer is not None and _clamped(item, t.shape[dim]):
                note_clamp(t.shape[dim])
            stop = max(stop, start)
            spec.append((start, stop, step))
            shape.append(len(range(start, stop, step)))
            dim += 1
        elif _is_array_like(item):
            arr = _as_index_array(item)
            k = max(arr.ndim, 1) if arr.dtype == bool else 1
            for j in range(k):
                spec.append((0, t.shape[dim + j], 1))
            adv.append((len(shape), arr, tuple(t.shape[dim:dim + k])))
            shape.extend(t.shape[dim:dim + k])
            dim += k
        else:
            raise IndexError(f"unsupported index type {type(item).__name__}")
    return tuple(spec), tuple(shape), adv


def _bool_to_int(arr, dims_shape):
    if arr.shape != dims_shape:
        raise IndexError(f"mask of shape {list(arr.shape)} does not match the indexed dims "
                         f"{list(dims_shape)}")
    return list(np.nonzero(arr))


def _linear_index(adv, shape):
    """Fold the advanced indices (at result dims) into one index over merged dims."""
    arrays, dims, sizes = [], [], []
    for pos, arr, dshape in adv:
        parts = _bool_to_int(arr, dshape) if arr.dtype == bool else [arr.astype(np.int64)]
        for j, part in enumerate(parts):
            size = shape[pos + j]
            if part.size and (part.max() >= size or part.min() < -size):
                bad = part.max() if part.max() >= size else part.min()
                raise IndexError(f"index {bad} is out of bounds for dim {pos + j} with size "
                                 f"{size} (indexed shape {list(shape)})")
            arrays.append(np.where(part < 0, part + size, part))
            dims.append(pos + j)
            sizes.append(size)
    try:
        arrays = np.broadcast_arrays(*arrays)
    except ValueError:
        raise IndexError("shape mismatch: index tensors could not be broadcast together "
                         f"with shapes {[list(a.shape) for a in arrays]}") from None
    linear = np.zeros(arrays[0].shape, np.int64)
    for arr, size in zip(arrays, sizes):
        linear = linear * size + arr
    return linear, dims


def getitem(t, index) -> Tensor:
    """t[index] with PyTorch semantics."""
    if type(index) is int and not STATE.recorders and STATE.tracer is None and t.ndim and \
            not (t._rg and STATE.grad) and -t.shape[0] <= index < t.shape[0]:
        # (nothing records it: NumPy's view, as the slice and reshape below would give)
        return share_version(make(t._data[index, ...]), t)
    spec, shape, adv = _parse(t, index)
    full = tuple((0, s, 1) for s in t.shape)
    out = t if spec == full else _view("slice", t, {"index": spec})
    if out.shape != shape:
        out = _view("reshape", out, {"shape": shape})
    if not adv:
        return out
    linear, dims = _linear_index(adv, shape)
    consecutive = dims == list(range(dims[0], dims[0] + len(dims)))
    if not consecutive:
        rest = [d for d in range(out.ndim) if d not in dims]
        out = permute(out, *(dims + rest))
        dims = list(range(len(dims)))
    d0 = dims[0]
    merged = out.shape[:d0] + (-1,) + out.shape[d0 + len(dims):]
    merged = tuple(int(np.prod([out.shape[d] for d in dims])) if s == -1 else s
                   for s in merged)
    out = _view("reshape", out, {"shape": merged})
    return apply("take", (out, _index_tensor(linear, index)), {"dim": d0})


def _index_tensor(linear, index) -> Tensor:
    """The gather index; a trace constant when the JIT records and every index tensor is
    fixed by the code (lists, arrays, tensors built from literals), else a value the JIT
    cannot see (the traced call then runs eagerly)."""
    tracer = STATE.tracer
    items = index if isinstance(index, tuple) else (index,)
    if tracer is not None and all(_fixed_index(tracer, i) for i in items):
        return literal(linear)
    return wrap(linear)


def _fixed_index(tracer, item) -> bool:
    if not isinstance(item, Tensor) or (item.ndim == 0 and item._data.dtype.kind in "iu"):
        return True  # Python values, or an integer read with .item() (a value guard)
    node = item._node
    return tracer.is_literal(item) and (node is None or node.op == "input")


def _np_index(index):
    if isinstance(index, tuple):
        return tuple(_np_index(i) for i in index)
    if isinstance(index, Tensor):
        return index._data
    return index


def setitem(t, index, value) -> None:
    """t[index] = value: allowed where autograd is not involved (e.g. under no_grad)."""
    vrg = isinstance(value, Tensor) and value._rg
    if STATE.grad and (t._rg or vrg):
        raise RuntimeError(
            f"setitem on {t.dtype}{list(t.shape)} while autograd is recording is not "
            "supported; do the assignment under `with hn.no_grad():` or build the result "
            "with hn.where / hn.cat")
    if STATE.recorders:
        if not all(isinstance(r, TraceHooks) for r in STATE.recorders):
            raise RuntimeError("setitem inside hn.record() cannot be recorded; build the "
                               "result with hn.where or hn.cat instead")
        note_untraceable("t[index] = value (setitem) cannot be recorded; build the result "
                         "with hn.where or hn.cat to compile it")
    if not t._data.flags.writeable:
        raise RuntimeError(f"setitem: tensor {t.dtype}{list(t.shape)} is a read-only view")
    val = value._data if isinstance(value, Tensor) else value
    try:
        t._data[_np_index(index)] = val
    except (ValueError, IndexError) as exc:
        raise ShapeError(f"setitem: cannot assign {np.shape(val)} into index {index!r} of "
                         f"{t.dtype}{list(t.shape)}: {exc}") from exc
    version_counter(t)[0] += 1
