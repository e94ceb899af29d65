"""Bind the functional ops as Tensor methods (`t.exp()`, `t.sum(dim)`, `t.reshape(...)`)."""

from . import functional as F
from . import inplace, shape
from .tensor import Tensor

_FUNCTIONAL = [
    "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs", "neg",
    "sign", "square", "reciprocal", "pow", "add", "sub", "mul", "div", "maximum", "minimum",
    "clamp", "relu", "gelu", "silu", "sum", "mean", "var", "std", "amax", "amin", "argmax",
    "argmin", "max", "min", "logsumexp", "softmax", "log_softmax", "matmul",
]
_SHAPE = [
    "reshape", "view", "flatten", "permute", "transpose", "unsqueeze", "squeeze", "expand",
    "contiguous", "clone", "split", "chunk", "to",
]
_INPLACE = ["add_", "sub_", "mul_", "div_", "fill_", "zero_", "copy_", "clamp_"]


def _bind():
    for name in _FUNCTIONAL:
        setattr(Tensor, name, getattr(F, name))
    for name in _SHAPE:
        setattr(Tensor, name, getattr(shape, name))
    for name in _INPLACE:
        setattr(Tensor, name, getattr(inplace, name))
    Tensor.T = property(shape.t_property, doc="The tensor with its dims reversed.")
    Tensor.mT = property(lambda t: shape.transpose(t, -2, -1), doc="Swap the last two dims.")
    Tensor.float = lambda t: shape.to(t, "float32")
    Tensor.double = lambda t: shape.to(t, "float64")
    Tensor.long = lambda t: shape.to(t, "int64")
    Tensor.int = lambda t: shape.to(t, "int32")
    Tensor.bool = lambda t: shape.to(t, "bool")
    Tensor.expand_as = lambda t, other: shape.expand(t, *other.shape)
    Tensor.view_as = lambda t, other: shape.reshape(t, *other.shape)
    Tensor.backward = _backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate gradients of this tensor into the leaves' `.grad`."""
    from .autograd import backward
    backward(self, gradient, retain_graph, create_graph, inputs)


_bind()
