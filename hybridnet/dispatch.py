"""Eager dispatch: run a primitive with NumPy and, when needed, record it on the tape.

`apply(name, inputs, attrs)` is the single entry point every tensor op goes
through. It computes the result with the registry's impl, then appends a
`TapeNode` when autograd needs it (grad mode on and an input requires grad) or
inside `hn.record()`. Tensors that need neither carry no history.
"""

import weakref

import numpy as np

from compiler import dtypes as cd
from compiler.errors import OpError, describe
from compiler.ir import Node
from compiler.ops import REGISTRY, Trait

from ._state import STATE

_EMPTY = {}
_SCALARS = (int, float, bool)


class TapeNode(Node):
    """A recorded op: the IR node plus what eager autograd needs.

    value: the computed array (None once freed by backward);
    saved: (version_counter, version) pairs for the values the vjp reads;
    ref: for leaves, a weak reference to the tensor whose .grad accumulates.
    """

    __slots__ = ("value", "saved", "ref")

    def __repr__(self) -> str:
        return f"<{self.op}>"

    def name(self) -> str:
        """The op name, as PyTorch's grad_fn.name() gives it."""
        return self.op


# `ref` of a no-grad node whose recording ended: its tensor is a leaf for new ops.
CLOSED = object()

Tensor = None  # set by hybridnet.tensor once the class exists (avoids an import cycle)
_new = object.__new__


def _explain(opdef, arrays, attrs, exc):
    shapes = [np.shape(a) for a in arrays]
    dtypes = [np.result_type(a) for a in arrays]
    opdef.check(shapes, dtypes, attrs)  # raises the op's own clear error when it applies
    detail = f", {attrs}" if attrs else ""
    return OpError(f"{opdef.name}: {exc} (inputs {describe(shapes, dtypes)}{detail})")


def apply(name: str, inputs, attrs=_EMPTY):
    """Run primitive `name` on tensors (or dtype-matched NumPy scalars) eagerly."""
    opdef = REGISTRY[name]
    T = Tensor
    arrays = [x._data if isinstance(x, T) else x for x in inputs]
    try:
        out = opdef.impl(*arrays, **attrs)
        if out.__class__ is not np.ndarray:
            out = np.asarray(out)
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        raise _explain(opdef, arrays, attrs, exc) from exc
    res = _new(T)
    res._data, res._rg, res._grad, res._node, res._vc = out, False, None, None, None
    needs = False
    if STATE.grad and opdef.vjp is not None:
        for x in inputs:
            if isinstance(x, T) and x._rg:
                needs = True
                break
    if needs or STATE.recorders:
        record(opdef, inputs, attrs, res, needs)
    return res


def _fast(opdef, a, b, da, db):
    """apply() for two same-dtype tensors (or a tensor and a weak Python scalar)."""
    try:
        out = opdef.impl(da, db)
        if out.__class__ is not np.ndarray:
            out = np.asarray(out)
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        raise _explain(opdef, [da, db], _EMPTY, exc) from exc
    res = _new(Tensor)
    res._data, res._rg, res._grad, res._node, res._vc = out, False, None, None, None
    if STATE.recorders or (STATE.grad and (a._rg or (isinstance(b, Tensor) and b._rg))
                           and opdef.vjp is not None):
        if not isinstance(b, Tensor):
            b = da.dtype.type(b)
        record(opdef, (a, b), _EMPTY, res, STATE.grad and opdef.vjp is not None and (
            a._rg or (isinstance(b, Tensor) and b._rg)))
    return res


# ---- recording --------------------------------------------------------------------------


def version_counter(t) -> list:
    """The tensor's shared version counter, created on first use."""
    vc = t._vc
    if vc is None:
        vc = t._vc = [0]
    return vc


def node_of(x):
    """The tape node for a tensor (a fresh leaf if it has no history) or a scalar."""
    T = Tensor
    if not isinstance(x, T):
        arr = np.asarray(x)
        node = TapeNode("const", (), {"value": arr.item(), "dtype": str(arr.dtype)}, (),
                        arr.dtype)
        node.value, node.saved, node.ref = arr, (), None
        return node
    node = x._node
    if node is None or (not node.requires_grad and (
            node.ref is CLOSED or (x._rg and STATE.grad))):
        # A fresh leaf also for a tensor whose history is dataflow only: recorded by an
        # `hn.record()` block that has ended, or (under recording) a tensor that requires
        # grad updated in place under no_grad, for which autograd needs a leaf again.
        node = TapeNode("input", (), {}, x._data.shape, x._data.dtype, x._rg)
        node.value, node.saved, node.ref = x._data, (), weakref.ref(x)
        x._node = node
    return node


def record(opdef, inputs, attrs, res, requires_grad):
    """Append a node for `res = opdef(*inputs)` and attach it to `res`."""
    T = Tensor
    node = TapeNode(opdef.name, tuple(node_of(x) for x in inputs), attrs, res._data.shape,
                    res._data.dtype, requires_grad)
    node.value, node.ref = res._data, None
    saved = []
    if "in" in opdef.saves:
        for x in inputs:
            if isinstance(x, T):
                vc = version_counter(x)
                saved.append((vc, vc[0]))
    if "out" in opdef.saves:
        vc = version_counter(res)
        saved.append((vc, vc[0]))
    node.saved = tuple(saved)
    res._node = node
    res._rg = requires_grad
    for rec in STATE.recorders:
        rec.append(node)
    return node


# ---- dtype promotion for Python-facing ops ----------------------------------------------


def cast(t, dtype: np.dtype):
    """`t` converted to `dtype` through the `cast` primitive (so it is recorded)."""
    if t._data.dtype == dtype:
        return t
    return apply("cast", (t,), {"dtype": str(dtype)})


def as_operand(x, name: str):
    """Accept a tensor or a Python/NumPy scalar as an operand of op `name`."""
    T = Tensor
    if isinstance(x, T):
        return x
    if isinstance(x, (np.generic, np.ndarray)) and np.ndim(x) == 0:
        return x.item()
    if isinstance(x, _SCALARS):
        return x
    if isinstance(x, np.ndarray):
        from .creation import tensor
        return tensor(x)
    raise TypeError(f"{name}: unsupported operand type {type(x).__name__}; "
                    f"expected a hybridnet Tensor or a Python number")


def promote(name: str, operands):
    """Cast tensor operands and type scalars to the op's common dtype (PyTorch rules)."""
    T = Tensor
    opdef = REGISTRY[name]
    tensors = [x for x in operands if isinstance(x, T)]
    first = tensors[0]._data.dtype
    if all(t._data.dtype is first for t in tensors) and len(tensors) == len(operands):
        dt = first
    elif len(tensors) == 1 and len(operands) == 2:
        scalar = operands[1] if operands[0] is tensors[0] else operands[0]
        dt = cd.with_scalar(first, scalar)
    else:
        dt = cd.result_type([(t._data.dtype, cd.priority(t._data.ndim)) if isinstance(t, T)
                             else (cd.scalar_dtype(t), 0) for t in operands])
    if Trait.FLOAT_ONLY in opdef.traits and dt.kind != "f":
        dt = cd.DEFAULT_FLOAT
    out = []
    for x in operands:
        if isinstance(x, T):
            out.append(x if x._data.dtype is dt else cast(x, dt))
        else:
            out.append(dt.type(x))
    return out


def binary(name: str, a, b):
    """A broadcasting binary op on tensors and/or Python scalars, with promotion."""
    opdef = REGISTRY[name]
    if isinstance(a, Tensor):
        da = a._data
        kind = da.dtype.kind
        if isinstance(b, Tensor):
            db = b._data
            if db.dtype is da.dtype and (kind == "f" or Trait.FLOAT_ONLY not in opdef.traits):
                return _fast(opdef, a, b, da, db)
        elif type(b) is float and kind == "f":
            return _fast(opdef, a, b, da, b)
    a, b = as_operand(a, name), as_operand(b, name)
    return apply(name, promote(name, (a, b)))


def unary(name: str, x):
    """A unary elementwise op; float-only ops promote integer inputs to float32."""
    opdef = REGISTRY[name]
    if x._data.dtype.kind != "f" and Trait.FLOAT_ONLY in opdef.traits:
        x = cast(x, cd.DEFAULT_FLOAT)
    try:
        out = opdef.impl(x._data)
        if out.__class__ is not np.ndarray:
            out = np.asarray(out)
    except (ValueError, TypeError) as exc:
        raise _explain(opdef, [x._data], _EMPTY, exc) from exc
    res = _new(Tensor)
    res._data, res._rg, res._grad, res._node, res._vc = out, False, None, None, None
    if STATE.recorders or (STATE.grad and x._rg and opdef.vjp is not None):
        record(opdef, (x,), _EMPTY, res, STATE.grad and x._rg and opdef.vjp is not None)
    return res


class EagerEmitter:
    """The op emitter vjp rules call when gradients are computed eagerly."""

    def __call__(self, name, *vals, **attrs):
        T = Tensor
        if all(isinstance(v, T) for v in vals):
            return apply(name, vals, attrs)
        like = next((v for v in vals if isinstance(v, T) and v._data.dtype.kind != "b"),
                    next(v for v in vals if isinstance(v, T)))
        dt = like._data.dtype
        return apply(name, [v if isinstance(v, T) else dt.type(v) for v in vals], attrs)

    def const(self, value, like):
        """A 0-d constant with `like`'s dtype."""
        return Tensor._wrap(np.asarray(value, dtype=like._data.dtype))

    def dtype(self, v) -> np.dtype:
        """The NumPy dtype of a value."""
        return v._data.dtype


EMIT = EagerEmitter()
