"""`hybridnet.nn.functional` (import as F): layers and losses as functions.

All are compositions of primitives (through hybridnet.functional), so they
record, differentiate and compile like any other op.
"""


import numpy as np

from compiler.errors import DTypeError, ShapeError

from .. import functional as _f
from .. import fused as _fused
from ..creation import random_tensor
from ..dispatch import apply
from ..functional import gelu, log_softmax, relu, sigmoid, silu, softmax, tanh, where  # noqa: F401
from ..shape import reshape
from ..tensor import literal
from .conv import conv1d, conv2d, conv_transpose2d, pad  # noqa: F401
from .losses import (  # noqa: F401
    binary_cross_entropy,
    cosine_similarity,
    dropout2d,
    huber_loss,
    kl_div,
    smooth_l1_loss,
)
from .pooling import (  # noqa: F401
    adaptive_avg_pool2d,
    avg_pool1d,
    avg_pool2d,
    batch_norm,
    max_pool1d,
    max_pool2d,
)


def linear(input, weight, bias=None):
    """input @ weight.T + bias."""
    if input.shape[-1:] != weight.shape[-1:]:
        raise ShapeError(f"linear: input {input.dtype}{list(input.shape)} does not fit weight "
                         f"{weight.dtype}{list(weight.shape)} (in_features {weight.shape[-1]})")
    fast = _fused.linear(input, weight, bias, _linear)
    return _linear(input, weight, bias) if fast is None else fast


def _linear(input, weight, bias=None):
    out = input @ weight.T
    return out if bias is None else out + bias


def dropout(input, p: float = 0.5, training: bool = True):
    """Zero elements with probability p and scale the rest by 1/(1-p) (when training)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    return input * random_tensor("dropout", input.shape, input._data.dtype, p)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalize over the trailing `normalized_shape` dims, then scale and shift."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if input.shape[input.ndim - len(shape):] != shape:
        raise ShapeError(f"layer_norm: input {input.dtype}{list(input.shape)} does not end "
                         f"with normalized_shape {list(shape)}")
    dims = tuple(range(input.ndim - len(shape), input.ndim))
    mu = _f.mean(input, dims, keepdim=True)
    centered = input - mu
    var = _f.mean(centered * centered, dims, keepdim=True)
    out = centered * _f.rsqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def embedding(input, weight, padding_idx=None):
    """Rows of `weight` picked by the integer tensor `input`."""
    if input._data.dtype.kind not in "iu":
        raise DTypeError(f"embedding: indices must be an integer tensor, got {input.dtype}")
    n = weight.shape[0]
    if input.numel() and (input._data.max() >= n or input._data.min() < -n):
        raise IndexError(f"embedding: index {int(input._data.max())} is out of range for "
                         f"{n} embeddings")
    out = apply("take", (weight, input), {"dim": 0})
    if padding_idx is not None:
        mask = reshape(input == padding_idx, *input.shape, 1)
        out = where(mask, out.detach(), out)  # no gradient into the padding row
    return out


# ---- losses ------------------------------------------------------------------------------


def _reduce(loss, reduction: str, op: str):
    if reduction == "mean":
        return _f.mean(loss)
    if reduction == "sum":
        return _f.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _same_shape(op, input, target):
    if input.shape != target.shape:
        raise ShapeError(f"{op}: input {input.dtype}{list(input.shape)} and target "
                         f"{target.dtype}{list(target.shape)} must have the same shape "
                         "(broadcasting a loss is almost always a bug)")


def mse_loss(input, target, reduction: str = "mean"):
    """Mean squared error."""
    _same_shape("mse_loss", input, target)
    diff = input - target
    return _reduce(diff * diff, reduction, "mse_loss")


def l1_loss(input, target, reduction: str = "mean"):
    """Mean absolute error."""
    _same_shape("l1_loss", input, target)
    return _reduce(_f.abs(input - target), reduction, "l1_loss")


def binary_cross_entropy_with_logits(input, target, weight=None, reduction: str = "mean",
                                     pos_weight=None):
    """Sigmoid + binary cross-entropy in one numerically stable expression."""
    _same_shape("binary_cross_entropy_with_logits", input, target)
    # log(1 + e^-x) = log(1 + e^-|x|) + relu(-x), with |x| and relu(-x) = (|x| - x) / 2
    # written so that the gradient at x = 0 is the true one (-1/2), not a zero subgradient.
    abs_x = where(input >= 0, input, -input)
    softplus_neg = _f.log(1.0 + _f.exp(-abs_x)) + (abs_x - input) * 0.5
    if pos_weight is None:
        loss = (1.0 - target) * input + softplus_neg
    else:
        loss = (1.0 - target) * input + (1.0 + (pos_weight - 1.0) * target) * softplus_neg
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def _class_last(input, target, op):
    """(N, C, d1, ...) logits -> (M, C) rows; int targets -> (M,)."""
    if target._data.dtype.kind not in "iu":
        raise DTypeError(f"{op}: target must be an integer tensor of class indices, got "
                         f"{target.dtype}")
    if input.ndim == 1:
        input, target = reshape(input, 1, -1), reshape(target, 1)
    if input.ndim > 2:
        dims = (0,) + tuple(range(2, input.ndim)) + (1,)
        input = reshape(input.permute(*dims), -1, input.shape[1])
        target = reshape(target, -1)
    if target.shape != input.shape[:1]:
        raise ShapeError(f"{op}: target {target.dtype}{list(target.shape)} does not match "
                         f"input {input.dtype}{list(input.shape)} (expected {input.shape[0]} "
                         "class indices)")
    return input, target


def _check_targets(tgt, n_classes, ignore_index, op):
    """Raise for class indices outside [0, C) (ignore_index aside). Written with ops, so
    under the JIT it becomes a value guard: a bad target in a later call leaves the
    compiled path and raises here, eagerly."""
    bad = ((tgt < 0) | (tgt >= n_classes)) & (tgt != ignore_index)
    if _f.sum(bad) > 0:
        _check_target_array(tgt._data, n_classes, ignore_index, op)


def _check_target_array(t, n_classes, ignore_index, op):
    bad = (t != ignore_index) & ((t < 0) | (t >= n_classes))
    if bad.any():
        raise IndexError(f"{op}: target {int(t[bad][0])} is out of bounds for {n_classes} "
                         "classes")


def nll_loss(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """Negative log-likelihood of log-probabilities `input` (N, C) at int `target` (N,)."""
    logp, tgt = _class_last(input, target, "nll_loss")
    n_classes = logp.shape[1]
    _check_targets(tgt, n_classes, ignore_index, "nll_loss")
    hit = reshape(tgt, -1, 1) == literal(np.arange(n_classes).reshape(1, n_classes))
    picked = _f.sum(where(hit, logp, 0.0), 1)
    valid = tgt != ignore_index
    if weight is None:
        row_w = where(valid, 1.0, 0.0).to(logp.dtype)
    else:
        safe = where(valid, tgt, 0)
        row_w = where(valid, apply("take", (weight, safe), {"dim": 0}), 0.0)
    losses = -picked * row_w
    if reduction == "mean":
        return _f.sum(losses) / _f.sum(row_w)  # 0/0 = nan when every target is ignored
    losses = losses if input.ndim != 1 else reshape(losses, ())
    if reduction == "none" and input.ndim > 2:
        losses = reshape(losses, target.shape)
    return _reduce(losses, reduction, "nll_loss")


def cross_entropy(input, target, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0):
    """log_softmax over the class dim (1, or 0 for 1-D input) followed by nll_loss."""
    if weight is None and label_smoothing <= 0.0:
        fast = _fused.cross_entropy(
            input, target, ignore_index, reduction,
            lambda t, c: _check_target_array(t, c, ignore_index, "nll_loss"),
            lambda x: cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction))
        if fast is not None:
            return fast
    class_dim = 0 if input.ndim == 1 else 1
    logp = log_softmax(input, class_dim)
    loss = nll_loss(logp, target, weight, ignore_index, reduction)
    if label_smoothing <= 0.0:
        return loss
    if weight is not None:
        raise NotImplementedError("cross_entropy: label_smoothing with weight is not supported")
    rows, tgt = _class_last(logp, target, "cross_entropy")
    valid = where(tgt != ignore_index, 1.0, 0.0).to(rows.dtype)
    smooth = -_f.mean(rows, 1) * valid
    if reduction == "mean":
        smooth = _f.sum(smooth) / _f.maximum(_f.sum(valid), 1.0)
    elif reduction == "sum":
        smooth = _f.sum(smooth)
    else:  # 'none': the shape of target ((), (N,) or (N, d1, ...))
        smooth = reshape(smooth, target.shape)
    return loss * (1.0 - label_smoothing) + smooth * label_smoothing


