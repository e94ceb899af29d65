"""Gradient clipping with PyTorch's names, signatures and semantics.

Everything is written with tensor ops, so a clip inside a traced training step compiles
with the rest of the step: the total norm is a 0-d tensor, the clip coefficient
`clamp(max_norm / (total + 1e-6), max=1.0)` is one too, and the gradients are scaled
in place by it, clipped or not (no Python branch on the norm, hence no value guard).
Only `error_if_nonfinite=True` reads the norm in Python (a value guard in a trace: a
non-finite norm takes the side exit and the eager call raises).
"""

import functools
import math
import types
import warnings

import numpy as np

from ...autograd import no_grad
from ...functional import abs as _abs
from ...functional import amax, amin, clamp, sqrt
from ...functional import sum as _sum
from ...shape import stack
from ...tensor import Tensor, wrap

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_",
           "get_total_norm"]


def _no_grad(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with no_grad():
            return fn(*args, **kwargs)
    return wrapper


def _tensor_list(tensors) -> list:
    return [tensors] if isinstance(tensors, Tensor) else list(tensors)


def _vector_norm(x, p: float):
    """torch.linalg.vector_norm(x, p) over all elements (a 0-d tensor of x's dtype)."""
    if p == math.inf:
        return amax(_abs(x))
    if p == -math.inf:
        return amin(_abs(x))
    if p == 0:
        return _sum(x != 0).to(x.dtype)
    if p == 1:
        return _sum(_abs(x))
    if p == 2:
        return sqrt(_sum(x * x))
    return _sum(_abs(x) ** p) ** (1.0 / p)


def _is_finite(t) -> bool:
    # |t| <= max is False for nan and for +-inf (one comparison: nothing to simplify away)
    return bool(_abs(t) <= float(np.finfo(t._data.dtype).max))


@_no_grad
def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The `norm_type`-norm of all `tensors` together, as if concatenated into one vector.

    A 0-d tensor (`hn.tensor(0.0)` for no tensors). `norm_type` may be `inf`; with
    `error_if_nonfinite=True` a nan or infinite total raises RuntimeError. `foreach` is
    accepted for PyTorch compatibility (one implementation serves both).
    """
    tensors = _tensor_list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return wrap(np.array(0.0, np.float32))
    norms = [_vector_norm(t, norm_type) for t in tensors]
    total = _vector_norm(stack(norms), norm_type)
    if error_if_nonfinite and not _is_finite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    return total


@_no_grad
def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale the gradients of `parameters` in place by min(max_norm / (total_norm + 1e-6), 1)."""
    grads = [p.grad for p in _tensor_list(parameters) if p.grad is not None]
    if not grads:
        return
    coef = clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)
    with np.errstate(invalid="ignore"):  # inf * 0 = nan, silently, as in PyTorch
        for g in grads:
            g.mul_(coef)


@_no_grad
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Clip the gradient norm of `parameters` (a tensor or an iterable) in place.

    The norm is taken over all gradients together, as if concatenated into one vector;
    they are scaled by min(max_norm / (total + 1e-6), 1). Returns the total norm (before
    clipping) as a 0-d tensor. `norm_type` may be `inf`.
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)
        if is_generator and not parameters:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will "
                          "occur.", stacklevel=3)
    grads = [p.grad for p in parameters if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


def clip_grad_norm(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                   foreach=None):
    """Deprecated alias of `clip_grad_norm_` (as in PyTorch)."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


@_no_grad
def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp the gradients of `parameters` into [-clip_value, clip_value], in place."""
    clip_value = float(clip_value)
    for p in _tensor_list(parameters):
        if p.grad is not None:
            p.grad.clamp_(min=-clip_value, max=clip_value)
