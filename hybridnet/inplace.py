"""In-place ops (`add_`, `mul_`, `zero_`, ...), with PyTorch's safety checks.

Without recording, the NumPy buffer is updated in place and the version counter
bumped, so a backward that saved the old value raises instead of using stale
data. When the op must be recorded (grad mode with an input that requires grad,
or inside `hn.record()`), the result is computed out of place, written into the
buffer, and the tensor is rebound to the new node, as PyTorch rebases history.
"""

import numpy as np

from compiler import dtypes as cd
from compiler.errors import DTypeError, ShapeError
from compiler.ops import REGISTRY, Trait

from ._state import DATA_ALIASES, STATE
from .dispatch import binary, cast, common_dtype
from .functional import clamp, where
from .shape import clone, expand
from .tensor import Tensor, literal, version_counter

_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide}


def _data_base(t):
    """While a call is recorded: the tensor whose `.data` `t` is (same buffer), or None.
    `p.data.add_(...)` updates p itself, untracked by autograd, as in PyTorch; recording
    it as an update of p lets a traced step write p back (a update through an alias of
    p's buffer could not be replayed)."""
    if not STATE.recorders:
        return None
    entry = DATA_ALIASES.get(id(t))
    if entry is None or entry[0]() is not t:
        return None
    base = entry[1]()
    if base is None or base._data is not t._data or not base.is_leaf:
        return None  # (a non-leaf keeps its history: the alias update stays a view update)
    return base


def _through_base(t, base, update):
    """Run `update(base)` without autograd and rebind the alias to the result."""
    grad, STATE.grad = STATE.grad, False
    try:
        update(base)
    finally:
        STATE.grad = grad
    t._node = base._node
    return t


def _check_leaf(t, name):
    if STATE.grad and t._rg and t.is_leaf:
        raise RuntimeError(
            f"{name}: a leaf tensor that requires grad ({t.dtype}{list(t.shape)}) is used in "
            f"an in-place operation; wrap the update in `with hn.no_grad():`")
    node = t._node
    if STATE.grad and node is not None and node.requires_grad and node.opdef.has(Trait.MOVEMENT):
        raise RuntimeError(f"{name}: in-place update of a view ({node.op}) of a tensor that "
                           f"requires grad is not supported; use an out-of-place op")


def _check_result(t, name, res_shape: tuple, res_dtype):
    arr = t._data
    if res_shape != arr.shape:
        raise ShapeError(f"{name}: result of shape {list(res_shape)} cannot be written into "
                         f"{t.dtype}{list(t.shape)} (in-place ops do not broadcast self)")
    if res_dtype is not arr.dtype and cd.category(res_dtype) > cd.category(arr.dtype):
        raise DTypeError(f"{name}: result type {res_dtype} can't be cast to the in-place "
                         f"tensor's dtype {t.dtype}")
    if not arr.flags.writeable:
        raise RuntimeError(f"{name}: tensor {t.dtype}{list(t.shape)} is a read-only view "
                           f"(e.g. from expand); clone() it first")


def _needs_recording(t, other) -> bool:
    if STATE.recorders:
        return True
    return STATE.grad and (t._rg or (isinstance(other, Tensor) and other._rg))


def snapshot(t) -> Tensor:
    """A recorded copy of t, so a recorded in-place op never saves the buffer it overwrites."""
    return clone(t)


def write_result(t, res: Tensor, name: str) -> Tensor:
    """Store a recorded out-of-place result into `t` and rebind t to its node."""
    _check_result(t, name, res.shape, res._data.dtype)
    res = cast(res, t._data.dtype)
    np.copyto(t._data, res._data)
    version_counter(t)[0] += 1
    if res._node is None:
        t._node, t._rg = None, False
    else:
        for rec in STATE.recorders:
            rec.rebind(t, t._node)
        t._node = res._node
        if STATE.grad or not t._rg:  # under no_grad a tensor keeps requires_grad (PyTorch)
            t._rg = res._rg
    return t


def binary_(t, name, other, alpha=1):
    """t <- t (op) other, in place."""
    label = name + "_"
    base = _data_base(t)
    if base is not None:
        return _through_base(t, base, lambda b: binary_(b, name, other, alpha))
    _check_leaf(t, label)
    if not (type(alpha) in (int, float) and alpha == 1):  # (a traced step's alpha: a tensor)
        other = other * alpha
    if _needs_recording(t, other):
        # (a vjp that reads its inputs must not see the buffer this op overwrites)
        src = snapshot(t) if REGISTRY[name].saves else t
        return write_result(t, binary(name, src, other), label)
    od = other._data if isinstance(other, Tensor) else other
    res_dtype = common_dtype(name, (t, other))
    shape = np.broadcast_shapes(t.shape, np.shape(od)) if isinstance(other, Tensor) else t.shape
    _check_result(t, label, shape, res_dtype)
    if isinstance(od, np.ndarray) and od.dtype != res_dtype:
        od = od.astype(res_dtype)  # computed in the promoted dtype, as the out-of-place op
    _UFUNCS[name](t._data, od, out=t._data)
    version_counter(t)[0] += 1
    return t


def add_(self, other, *, alpha=1):
    """self += alpha * other, in place."""
    return binary_(self, "add", other, alpha)


def sub_(self, other, *, alpha=1):
    """self -= alpha * other, in place."""
    return binary_(self, "sub", other, alpha)


def mul_(self, other):
    """self *= other, in place."""
    return binary_(self, "mul", other)


def div_(self, other):
    """self /= other, in place."""
    return binary_(self, "div", other)


def fill_(self, value):
    """Set every element to `value`, in place."""
    base = _data_base(self)
    if base is not None:
        return _through_base(self, base, lambda b: fill_(b, value))
    _check_leaf(self, "fill_")
    if _needs_recording(self, value):
        return write_result(self, _overwrite(self, value), "fill_")
    _check_result(self, "fill_", self.shape, self._data.dtype)
    self._data[...] = value.item() if isinstance(value, Tensor) else value
    version_counter(self)[0] += 1
    return self


def _overwrite(t, value):
    """`value` in t's place; where(all-true, value, t) keeps t in the graph with zero gradient."""
    return where(literal(np.ones(t.shape, bool)), value, snapshot(t))


def zero_(self):
    """Set every element to zero, in place."""
    return fill_(self, 0)


def copy_(self, src):
    """Copy `src` (broadcast to self's shape, cast to self's dtype) into self."""
    base = _data_base(self)
    if base is not None:
        return _through_base(self, base, lambda b: copy_(b, src))
    _check_leaf(self, "copy_")
    if not isinstance(src, Tensor):
        src = literal(np.asarray(src))
    if _needs_recording(self, src):
        return write_result(self, _overwrite(self, cast(expand(src, *self.shape),
                                                        self._data.dtype)), "copy_")
    try:
        np.copyto(self._data, np.broadcast_to(src._data, self.shape), casting="unsafe")
    except ValueError:
        raise ShapeError(f"copy_: source {src.dtype}{list(src.shape)} cannot be broadcast to "
                         f"{self.dtype}{list(self.shape)}") from None
    version_counter(self)[0] += 1
    return self


def clamp_(self, min=None, max=None):  # noqa: A002
    """Clamp into [min, max], in place."""
    base = _data_base(self)
    if base is not None:
        return _through_base(self, base, lambda b: clamp_(b, min, max))
    _check_leaf(self, "clamp_")
    if _needs_recording(self, None) or isinstance(min, Tensor) or isinstance(max, Tensor):
        if not _needs_recording(self, min if isinstance(min, Tensor) else max):
            res = clamp(self, min, max)  # (tensor bounds: computed out of place, then stored)
            _check_result(self, "clamp_", res.shape, res._data.dtype)
            np.copyto(self._data, res._data, casting="unsafe")
            version_counter(self)[0] += 1
            return self
        return write_result(self, clamp(snapshot(self), min, max), "clamp_")
    np.clip(self._data, min, max, out=self._data)
    version_counter(self)[0] += 1
    return self
