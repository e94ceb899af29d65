"""Eager dispatch: run a primitive with NumPy and, when needed, record it on the tape.

`run(opdef, inputs, arrays, attrs, rg)` is the one path every tensor op takes: it
computes the result with the registry's impl, builds the tensor with the one
constructor (`tensor.make`), and appends a `TapeNode` when autograd needs it (grad
mode on and an input requires grad) or inside `hn.record()`. Tensors that need
neither carry no history. The entry points only prepare its arguments: `apply`
(general), and the per-op functions `unary_op(name)` and `binary_op(name)` return
(PyTorch's dtype promotion: `common_dtype`, `promote`).
"""

import functools
import weakref

import numpy as np

from compiler import dtypes as cd
from compiler.emitter import Emitter
from compiler.errors import OpError, describe
from compiler.ir import Node
from compiler.ops import REGISTRY, Trait

from ._state import STATE
from .tensor import Tensor, as_array, literal, make, version_counter, wrap

NO_ATTRS = {}
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


def _explain(opdef, arrays, attrs, exc):
    shapes = [np.shape(a) for a in arrays]
    dtypes = [np.result_type(a) for a in arrays]
    opdef.check(shapes, dtypes, attrs)  # raises the op's own clear error when it applies
    detail = f", {attrs}" if attrs else ""
    return OpError(f"{opdef.name}: {exc} (inputs {describe(shapes, dtypes)}{detail})")


def run(opdef, inputs, arrays, attrs, rg):
    """The one eager path: `opdef` on `inputs` (tensors, or scalars typed as the op's
    dtype; a Python float only beside a float tensor), whose arrays are `arrays`;
    `rg`: does an input require grad? The op is recorded inside `hn.record()`, or
    when grad mode is on, the op is differentiable and `rg` holds."""
    try:
        out = opdef.impl(*arrays, **attrs) if attrs else opdef.impl(*arrays)
        if out.__class__ is not np.ndarray:
            out = np.asarray(out)
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        raise _explain(opdef, arrays, attrs, exc) from exc
    res = make(out)
    if STATE.recorders or (rg and STATE.grad and opdef.vjp is not None):
        record(opdef, inputs, attrs, res, rg and STATE.grad and opdef.vjp is not None)
    return res


def apply(name: str, inputs, attrs=NO_ATTRS):
    """Run primitive `name` on tensors (or dtype-matched NumPy scalars) eagerly."""
    rg = False
    arrays = []
    for x in inputs:
        if isinstance(x, Tensor):
            arrays.append(x._data)
            rg = rg or x._rg
        else:
            arrays.append(x)
    return run(REGISTRY[name], inputs, arrays, attrs, rg)


# ---- recording --------------------------------------------------------------------------


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


def _typed(x, inputs):
    """A Python float operand (weak, as in PyTorch) typed as the float tensor beside it."""
    for t in inputs:
        if isinstance(t, Tensor) and t._data.dtype.kind == "f":
            return t._data.dtype.type(x)
    return x


def record(opdef, inputs, attrs, res, requires_grad):
    """Append a node for `res = opdef(*inputs)` and attach it to `res`."""
    T = Tensor
    node = TapeNode(opdef.name, tuple(node_of(_typed(x, inputs) if x.__class__ is float else x)
                                      for x in inputs), attrs,
                    res._data.shape, res._data.dtype, requires_grad)
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
        return literal(as_array(x))
    raise TypeError(f"{name}: unsupported operand type {type(x).__name__}; "
                    f"expected a hybridnet Tensor or a Python number")


def common_dtype(name: str, operands) -> np.dtype:
    """The dtype op `name` computes in for tensor and Python-scalar `operands`: PyTorch's
    promotion (`compiler.dtypes`), then float32 for a float-only op on ints or bools."""
    T = Tensor
    dt = None
    if len(operands) == 2:
        a, b = operands
        if isinstance(a, T):
            first = a._data.dtype
            if not isinstance(b, T):
                dt = cd.with_scalar(first, b)
            elif b._data.dtype is first:
                dt = first
        elif isinstance(b, T):
            dt = cd.with_scalar(b._data.dtype, a)
    if dt is None:
        dt = cd.result_type([(t._data.dtype, cd.priority(t._data.ndim)) if isinstance(t, T)
                             else (cd.scalar_dtype(t), 0) for t in operands])
    if dt.kind != "f" and REGISTRY[name].has(Trait.FLOAT_ONLY):
        dt = cd.DEFAULT_FLOAT
    return dt


def promote(name: str, operands):
    """Cast tensor operands and type scalars to the op's common dtype (PyTorch rules)."""
    T = Tensor
    dt = common_dtype(name, operands)
    out = []
    for x in operands:
        if isinstance(x, T):
            out.append(x if x._data.dtype is dt else cast(x, dt))
        else:
            out.append(dt.type(x))
    return out


@functools.cache
def binary_op(name: str):
    """The entry point of broadcasting binary op `name`: `op(a, b)` on tensors and/or
    Python scalars, with PyTorch's promotion. Tensors of one dtype, or a float tensor
    and a Python float (weak, as in PyTorch), go straight to `run`."""
    opdef = REGISTRY[name]
    float_only = opdef.has(Trait.FLOAT_ONLY)

    def op(input, other):
        if isinstance(input, Tensor):
            da = input._data
            if isinstance(other, Tensor):
                db = other._data
                dt = da.dtype
                if db.dtype is dt and (not float_only or dt.kind == "f"):
                    return run(opdef, (input, other), (da, db), NO_ATTRS,
                               input._rg or other._rg)
            elif other.__class__ is float and da.dtype.kind == "f":
                return run(opdef, (input, other), (da, other), NO_ATTRS, input._rg)
        a, b = as_operand(input, name), as_operand(other, name)
        return apply(name, promote(name, (a, b)))
    return _named(op, name, opdef)


@functools.cache
def unary_op(name: str):
    """The entry point of unary elementwise op `name`: `op(x)`; a float-only op
    promotes integer and bool inputs to float32."""
    opdef = REGISTRY[name]
    if opdef.has(Trait.FLOAT_ONLY):
        def op(input):
            if input._data.dtype.kind != "f":
                input = cast(input, cd.DEFAULT_FLOAT)
            return run(opdef, (input,), (input._data,), NO_ATTRS, input._rg)
    else:
        def op(input):
            return run(opdef, (input,), (input._data,), NO_ATTRS, input._rg)
    return _named(op, name, opdef)


def _named(op, name, opdef):
    op.__name__ = op.__qualname__ = name
    op.__doc__ = opdef.doc or f"The `{name}` primitive."
    return op


def binary(name: str, a, b):
    """Binary op `name` on `a` and `b` (see `binary_op`)."""
    return binary_op(name)(a, b)


class EagerEmitter(Emitter):
    """The op emitter vjp rules call when gradients are computed eagerly: its values are
    tensors, its ops run through `apply` (so with history under create_graph)."""

    value_type = Tensor

    def op(self, name, vals, attrs):
        return apply(name, vals, attrs)

    def const(self, value, like):
        """A 0-d constant with `like`'s dtype."""
        return wrap(np.asarray(value, dtype=like._data.dtype))

    def dtype(self, v) -> np.dtype:
        """The NumPy dtype of a value."""
        return v._data.dtype


class _Sum:
    """A pending gradient the engine sums into: an array only this backward holds."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


class SummingEmitter(EagerEmitter):
    """The eager emitter of a backward that builds no history (no create_graph, no
    tracing, no `hn.record`): gradient contributions to one value are summed in place
    into one array it allocated, and window reads' gradients (x[t], chunks) are written
    into the window of that array, instead of a new array per contribution."""

    in_place = True

    def accumulate(self, old, g):
        summed = old.__class__ is _Sum
        buf = old.array if summed else old._data
        if g._data.shape != buf.shape or g._data.dtype != buf.dtype:
            return apply("add", (wrap(buf) if summed else old, g))
        if not summed:
            return _Sum(np.add(buf, g._data, out=np.empty(buf.shape, buf.dtype)))
        np.add(buf, g._data, out=buf)
        return old

    def add_window(self, old, g, shape, index):
        region = tuple(slice(*r) for r in index)
        if old is None:
            out = _Sum(np.zeros(shape, dtype=g._data.dtype))
        elif old.__class__ is _Sum:
            out = old
        else:
            out = _Sum(old._data.astype(np.result_type(old._data, g._data), copy=True))
        if out.array.dtype != g._data.dtype:
            out.array = out.array.astype(np.result_type(out.array, g._data))
        out.array[region] += g._data
        return out

    def settle(self, pending):
        return wrap(pending.array) if pending.__class__ is _Sum else pending


EMIT = EagerEmitter()
SUMMING = SummingEmitter()
