"""Helpers the distributions share (torch.distributions.utils' names)."""

import functools

import numpy as np

from compiler import dtypes as cd
from compiler.errors import ShapeError

from .. import functional as _f
from ..autograd import enable_grad
from ..shape import expand, reshape
from ..tensor import Tensor, literal

__all__ = ["broadcast_all", "clamp_probs", "lazy_property", "logits_to_probs",
           "probs_to_logits"]

NUMBER = (bool, int, float, np.integer, np.floating)


def broadcast_all(*values):
    """Tensors and Python numbers broadcast to one shape.

    Numbers become tensors of the first tensor's dtype (float32 if all are numbers), as
    constants; tensors are expanded (a recorded view, so gradients flow back)."""
    if not all(isinstance(v, (Tensor,) + NUMBER) for v in values):
        bad = next(type(v).__name__ for v in values if not isinstance(v, (Tensor,) + NUMBER))
        raise ValueError(f"Input arguments must all be instances of numbers.Number or "
                         f"hybridnet.Tensor, got {bad}.")
    dtype = next((v._data.dtype for v in values if isinstance(v, Tensor)), cd.DEFAULT_FLOAT)
    tensors = [v if isinstance(v, Tensor) else literal(np.asarray(v, dtype)) for v in values]
    try:
        shape = np.broadcast_shapes(*(t.shape for t in tensors))
    except ValueError:
        shapes = ", ".join(str(list(t.shape)) for t in tensors)
        raise ShapeError(f"the parameters' shapes {shapes} cannot be broadcast together") \
            from None
    return tuple(t if t.shape == shape else expand(t, *shape) for t in tensors)


def clamp_probs(probs):
    """Probabilities clamped into [eps, 1 - eps] (eps of their dtype)."""
    eps = float(np.finfo(probs._data.dtype).eps)
    return _f.clamp(probs, min=eps, max=1 - eps)


def probs_to_logits(probs, is_binary: bool = False):
    """Log-odds (binary) or log-probabilities of clamped probabilities."""
    ps = clamp_probs(probs)
    if is_binary:
        return _f.log(ps) - _f.log(1 - ps)  # (1 - ps is exact for ps >= 1/2)
    return _f.log(ps)


def logits_to_probs(logits, is_binary: bool = False):
    """sigmoid(logits) (binary) or softmax over the last dim."""
    if is_binary:
        return _f.sigmoid(logits)
    return _f.softmax(logits, -1)


def sum_rightmost(value, dim: int):
    """`value` summed over its `dim` rightmost dims."""
    if dim == 0:
        return value
    return _f.sum(reshape(value, value.shape[:value.ndim - dim] + (-1,)), -1)


class lazy_property:  # noqa: N801  (PyTorch's name)
    """A property computed on first use (with grad enabled) and then cached on the
    instance; a value given in __init__ takes its place."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        functools.update_wrapper(self, wrapped)

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        with enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value
