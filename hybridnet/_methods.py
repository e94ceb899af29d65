"""Bind operators and the op modules' functions onto `Tensor` (`t + u`, `t.exp()`,
`t.sum(dim)`, `t[i]`, `t.backward()`), once those modules exist.

The tensor type sits at the bottom of the user layer and imports none of the op
modules; this module, at the top, wires them in, as PyTorch's `_tensor.py` binds
methods onto the C tensor type.
"""

import numpy as np

from . import functional as F
from . import inplace, shape, tensor_ops
from .autograd import backward
from .creation import tensor
from .dispatch import binary_op
from .indexing import getitem, setitem
from .tensor import Tensor, init_fields

_FUNCTIONAL = [
    "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs", "neg",
    "sign", "square", "reciprocal", "pow", "add", "sub", "mul", "div", "maximum", "minimum",
    "clamp", "relu", "gelu", "silu", "sum", "mean", "var", "std", "amax", "amin", "argmax",
    "argmin", "max", "min", "logsumexp", "softmax", "log_softmax", "matmul",
]
_SHAPE = [
    "reshape", "view", "flatten", "permute", "transpose", "unsqueeze", "squeeze", "expand",
    "contiguous", "clone", "split", "chunk", "to", "detach",
]
_INPLACE = ["add_", "sub_", "mul_", "div_", "fill_", "zero_", "copy_", "clamp_"]

# name -> (op, reflected?): `t + u` is add(t, u); `2 - t` is sub(2, t). The commutative
# reflections keep the tensor first, which keeps the fast path.
_BINARY = {
    "__add__": ("add", False), "__radd__": ("add", False), "__sub__": ("sub", False),
    "__rsub__": ("sub", True), "__mul__": ("mul", False), "__rmul__": ("mul", False),
    "__truediv__": ("div", False), "__rtruediv__": ("div", True), "__pow__": ("pow", False),
    "__rpow__": ("pow", True), "__lt__": ("lt", False), "__le__": ("le", False),
    "__gt__": ("gt", False), "__ge__": ("ge", False),
}
_COMPARABLE = (Tensor, int, float, bool, np.generic, np.ndarray)


def _binary_method(name, reflected):
    op = binary_op(name)
    if not reflected:
        return op  # a plain function: bound as a method, `self` is its first operand

    def method(self, other):
        return op(other, self)
    return method


def _inplace_operator(method):
    def operator(self, other):  # through the method, so a subclass's override is used
        return getattr(self, method)(other)
    return operator


def _publish(name, fn):
    """Bind `fn` as Tensor.<name>; one made here (or a dispatch entry point no module
    publishes) is named Tensor.<name>, so tracebacks read well and pickle finds it."""
    if "<" in fn.__qualname__ or fn.__module__ in (__name__, "hybridnet.dispatch"):
        fn.__name__, fn.__qualname__, fn.__module__ = name, f"Tensor.{name}", Tensor.__module__
    setattr(Tensor, name, fn)


def _init(self, data, dtype=None, requires_grad=False):
    """Tensor(data, dtype=None, requires_grad=False): as hn.tensor(...)."""
    t = tensor(data, dtype=dtype, requires_grad=requires_grad)
    init_fields(self, t._data, t._rg)


_EQ, _NE = binary_op("eq"), binary_op("ne")


def _eq(self, other):
    if not isinstance(other, _COMPARABLE):
        return NotImplemented
    return _EQ(self, other)


def _ne(self, other):
    if not isinstance(other, _COMPARABLE):
        return NotImplemented
    return _NE(self, other)


def _invert(self):
    if self._data.dtype.kind != "b":
        raise TypeError(f"~ is only defined for bool tensors, got {self.dtype}")
    return _EQ(self, False)


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate gradients of this tensor into the leaves' `.grad`."""
    backward(self, gradient, retain_graph, create_graph, inputs)


def _operators():
    for name, (op, reflected) in _BINARY.items():
        _publish(name, _binary_method(op, reflected))
    for name, method in (("__iadd__", "add_"), ("__isub__", "sub_"), ("__imul__", "mul_"),
                         ("__itruediv__", "div_")):
        _publish(name, _inplace_operator(method))
    ops = {"__init__": _init, "__neg__": F.neg, "__abs__": F.abs, "__pos__": lambda t: t,
           "__eq__": _eq, "__ne__": _ne, "__invert__": _invert, "__and__": F.bitwise_and,
           "__or__": F.bitwise_or, "__matmul__": F.matmul,
           "__rmatmul__": lambda t, other: F.matmul(other, t), "__getitem__": getitem,
           "__setitem__": setitem}
    for name, fn in ops.items():
        _publish(name, fn)


def _bind():
    _operators()
    for name in _FUNCTIONAL:
        setattr(Tensor, name, getattr(F, name))
    for name in _SHAPE:
        setattr(Tensor, name, getattr(shape, name))
    for name in _INPLACE:
        setattr(Tensor, name, getattr(inplace, name))
    Tensor.T = property(shape.t_property, doc="The tensor with its dims reversed.")
    Tensor.mT = property(lambda t: shape.transpose(t, -2, -1), doc="Swap the last two dims.")
    _publish("float", lambda t: shape.to(t, "float32"))
    _publish("double", lambda t: shape.to(t, "float64"))
    _publish("long", lambda t: shape.to(t, "int64"))
    _publish("int", lambda t: shape.to(t, "int32"))
    _publish("bool", lambda t: shape.to(t, "bool"))
    _publish("expand_as", lambda t, other: shape.expand(t, *other.shape))
    _publish("view_as", lambda t, other: shape.reshape(t, *other.shape))
    Tensor.backward = _backward
    tensor_ops.bind(_publish)


_bind()
