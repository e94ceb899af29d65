"""More losses for `hybridnet.nn.functional` (binary_cross_entropy, smooth_l1_loss,
huber_loss, kl_div, cosine_similarity) and the channel dropout `dropout2d`.

PyTorch's names, signatures (legacy `size_average`/`reduce` included), defaults,
values, gradients, warnings and errors. Every function is a composition of hybridnet
ops, so it records, differentiates and traces like any other op.
"""

import math
import warnings

import numpy as np

from compiler.errors import DTypeError, OpError, ShapeError

from .. import functional as _f
from ..creation import random_tensor
from ..functional import where
from ..shape import broadcast_to
from ..tensor import literal

_REDUCTIONS = ("none", "mean", "sum")
_BCE_EPS = 1e-12  # PyTorch's EPSILON in binary_cross_entropy_backward


def _shape(t) -> str:
    return f"{t.dtype}{list(t.shape)}"


def _legacy_reduction(size_average, reduce, reduction):
    """PyTorch's _Reduction.legacy_get_string: the deprecated flags override reduction."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    out = "mean" if size_average and reduce else "sum" if reduce else "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use "
                  f"reduction='{out}' instead.", stacklevel=3)
    return out


def _check_reduction(op, reduction, allowed=_REDUCTIONS):
    if reduction not in allowed:
        raise ValueError(f"{op}: {reduction!r} is not a valid value for reduction (expected "
                         f"one of {', '.join(repr(r) for r in allowed)})")


def _reduce(loss, reduction):
    if reduction == "mean":
        return _f.mean(loss)
    if reduction == "sum":
        return _f.sum(loss)
    return loss


def _broadcast_shape(op, a, b, what=("input", "target")) -> tuple:
    try:
        return tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ShapeError(f"{op}: {what[0]} {_shape(a)} and {what[1]} {_shape(b)} cannot be "
                         "broadcast to a common shape") from None


def _warn_size(op, input, target):
    """PyTorch's warning for regression losses whose target shape differs (then they
    broadcast)."""
    if input.shape != target.shape:
        warnings.warn(f"{op}: Using a target size ({list(target.shape)}) that is different "
                      f"to the input size ({list(input.shape)}). This will likely lead to "
                      "incorrect results due to broadcasting. Please ensure they have the "
                      "same size.", stacklevel=3)
    return _broadcast_shape(op, input, target)


def _check_unit_interval(op, t, name):
    """Raise unless every value is in [0, 1] (NaN fails). Written with ops, so under the
    JIT it becomes a value guard, as nn.functional's target checks do."""
    bad = (t < 0.0) | (t > 1.0) | (t != t)
    if _f.sum(bad) > 0:
        raise OpError(f"{op}: all elements of {name} should be between 0 and 1 "
                      f"({name} is {_shape(t)})")


# ---- binary cross-entropy -----------------------------------------------------------------


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction: str = "mean"):
    """Binary cross-entropy of probabilities `input` against `target` (both in [0, 1]).

    As PyTorch: each log is clamped to >= -100, and the gradient is
    weight * (input - target) / max(input * (1 - input), 1e-12).
    """
    op = "binary_cross_entropy"
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(op, reduction)
    if target.shape != input.shape:
        raise ValueError(f"{op}: Using a target size ({list(target.shape)}) that is different "
                         f"to the input size ({list(input.shape)}) is deprecated. Please "
                         "ensure they have the same size.")
    for t, name in ((input, "input"), (target, "target")):
        if t._data.dtype.kind != "f":
            raise DTypeError(f"{op}: {name} must be a floating-point tensor, got {_shape(t)}")
    if target.dtype != input.dtype:
        raise DTypeError(f"{op}: target {_shape(target)} must have the dtype of input "
                         f"{_shape(input)}")
    if weight is not None and _broadcast_shape(op, target, weight,
                                               ("target", "weight")) != target.shape:
        raise ShapeError(f"{op}: weight {_shape(weight)} does not broadcast to the shape of "
                         f"input {_shape(input)}")
    _check_unit_interval(op, input, "input")
    _check_unit_interval(op, target, "target")
    x, t = input, target
    # Inside, where x * (1 - x) >= eps, the plain formula (both logs are > -28 there).
    inner = x * (1.0 - x) >= _BCE_EPS
    xs = where(inner, x, 0.5)
    loss_in = -(t * _f.log(xs) + (1.0 - t) * _f.log(1.0 - xs))
    # At the edges, the clamped value with PyTorch's gradients: (x - t) / eps for input and
    # -logit(x) for target (0 where infinite), each as (v - v.detach()) * constant.
    xd, td = x.detach(), t.detach()
    log_x, log_1mx = _f.log(xd), _f.log(1.0 - xd)
    value = -(td * _f.clamp(log_x, min=-100.0) + (1.0 - td) * _f.clamp(log_1mx, min=-100.0))
    d_target = log_1mx - log_x
    d_target = where(_f.abs(d_target) < math.inf, d_target, 0.0)
    loss_edge = value + (x - xd) * ((xd - td) / _BCE_EPS) + (t - td) * d_target
    loss = where(inner, loss_in, loss_edge)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# ---- regression losses ------------------------------------------------------------------


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0):
    """0.5 * d**2 / beta where |d| < beta, else |d| - 0.5 * beta (d = input - target);
    the L1 loss when beta is 0."""
    op = "smooth_l1_loss"
    _warn_size(op, input, target)
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(op, reduction)
    if beta < 0:
        raise OpError(f"{op} does not support negative values for beta (got {beta}).")
    diff = input - target
    adiff = _f.abs(diff)
    if beta == 0.0:
        return _reduce(adiff, reduction)
    loss = where(adiff < beta, diff * diff * (0.5 / beta), adiff - 0.5 * beta)
    return _reduce(loss, reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, weight=None):
    """0.5 * d**2 where |d| < delta, else delta * (|d| - 0.5 * delta); optionally
    weighted elementwise (weight shaped as input) before the reduction."""
    op = "huber_loss"
    _warn_size(op, input, target)
    _check_reduction(op, reduction)
    if weight is not None and weight.shape != input.shape:
        raise ValueError(f"{op}: Weights and input must have the same size (weight "
                         f"{_shape(weight)}, input {_shape(input)}).")
    if delta <= 0:
        raise OpError(f"{op} does not support non-positive values for delta (got {delta}).")
    diff = input - target
    adiff = _f.abs(diff)
    loss = where(adiff < delta, diff * diff * 0.5, (adiff - 0.5 * delta) * delta)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# ---- KL divergence ----------------------------------------------------------------------


def kl_div(input, target, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False):
    """Pointwise KL divergence target * (log(target) - input) of log-probabilities
    `input` (0 where target is 0), or exp(target) * (target - input) when log_target.

    reduction 'batchmean' divides the sum by the batch size (input.shape[0]); 'mean'
    divides by the number of elements (PyTorch warns that this is not the KL
    divergence, and so do we).
    """
    op = "kl_div"
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, reduction)
    else:
        _check_reduction(op, reduction, ("none", "batchmean", "sum", "mean"))
        if reduction == "mean":
            warnings.warn("reduction: 'mean' divides the total loss by both the batch size "
                          "and the support size.'batchmean' divides only by the batch size, "
                          "and aligns with the KL div math definition.'mean' will be changed "
                          "to behave the same as 'batchmean' in the next major release.",
                          stacklevel=2)
    _broadcast_shape(op, input, target)
    if log_target:
        loss = _f.exp(target) * (target - input)
    else:  # xlogy(target, target) - target * input; log of a negative target stays nan
        safe = where(target == 0.0, 1.0, target)
        loss = target * _f.log(safe) - target * input
    if reduction == "batchmean":
        total = _f.sum(loss)
        return total / input.shape[0] if input.ndim else total
    return _reduce(loss, reduction)


# ---- cosine similarity --------------------------------------------------------------------


def _norm(x, dim):
    """The 2-norm over dim (keepdim), with gradient 0 at a zero vector (as PyTorch's)."""
    sq = _f.sum(x * x, dim, keepdim=True)
    pos = sq > 0.0
    return where(pos, _f.sqrt(where(pos, sq, 1.0)), 0.0)


def _clamp_value(norm, eps):
    """max(norm, eps) in value while the gradient passes as if unclamped (PyTorch clamps
    the norms in place under no_grad)."""
    return where(norm < eps, (norm - norm.detach()) + eps, norm)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    """sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps)) over `dim`, x1 and x2 broadcast."""
    op = "cosine_similarity"
    shape = _broadcast_shape(op, x1, x2, ("x1", "x2"))
    if np.result_type(x1._data.dtype, x2._data.dtype).kind != "f":
        raise DTypeError(f"{op}: expected common dtype to be floating point, got x1 "
                         f"{_shape(x1)} and x2 {_shape(x2)}")
    lim = max(len(shape), 1)
    if not -lim <= dim < lim:
        raise ShapeError(f"{op}: dim {dim} is out of range for inputs broadcast to "
                         f"{list(shape)} (expected {-lim}..{lim - 1})")
    a = x1 if x1.shape == shape else broadcast_to(x1, shape)
    b = x2 if x2.shape == shape else broadcast_to(x2, shape)
    na, nb = _clamp_value(_norm(a, dim), eps), _clamp_value(_norm(b, dim), eps)
    return _f.sum((a / na) * (b / nb), dim)


# ---- channel dropout -------------------------------------------------------------------------


def dropout2d(input, p: float = 0.5, training: bool = True, inplace: bool = False):
    """Zero whole channels (input[n, c]) with probability p, scale the rest by 1/(1-p).

    As PyTorch: a 3-D input is taken as (N, C, L) (with PyTorch's warning), other
    ranks than 3 and 4 are accepted with a deprecation warning.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if input.ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is "
                      "deprecated and will result in an error in a future release. To retain "
                      "the behavior and silence this warning, please use dropout instead.",
                      stacklevel=2)
    elif input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that "
                      "channel-wise 1D dropout behavior is desired - input is interpreted as "
                      "shape (N, C, L), where C is the channel dim.", stacklevel=2)
    if not training or p == 0.0:
        return input
    if input.ndim < 2:
        raise ShapeError(f"dropout2d: Feature dropout requires at least 2 dimensions in the "
                         f"input, got {_shape(input)}")
    mask_shape = input.shape[:2] + (1,) * (input.ndim - 2)
    if p == 1.0:
        mask = literal(np.zeros(mask_shape, input._data.dtype))
    else:
        mask = random_tensor("dropout", mask_shape, input._data.dtype, p)
    return input.mul_(mask) if inplace else input * mask
