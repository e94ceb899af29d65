"""Pooling and batch norm as PyTorch defines them, composed of primitives.

Pooling works on each channel plane alone: the (N, C, H, W) input is seen as N*C
one-channel images, `unfold` gives each output position's window as the last dim,
and a reduction over it is the pool. max_pool2d picks the first maximum of each
window with argmax and routes the gradient to it alone (as PyTorch does; a max
reduction would split it between ties). Output sizes, ceil_mode and avg_pool2d's
divisors follow PyTorch's formulas, computed once per shape as constants.
"""

import math

import numpy as np

from compiler.errors import ShapeError

from .. import functional as _f
from ..autograd import no_grad
from ..dispatch import apply
from ..shape import reshape, squeeze
from ..tensor import Tensor, literal
from .conv import _desc, batched, need_float, ntuple, pad2d, unfold_windows


def pool_out(op, size, k, s, p, d, ceil_mode, x=None) -> int:
    """PyTorch's pooling output size along one dim (ceil_mode: the last window may hang
    over the end, but must start inside the input or its left padding)."""
    span = d * (k - 1) + 1
    room = size + 2 * p - span
    out = (-(-room // s) if ceil_mode else room // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    if out < 1:  # (ceil_mode keeps a window hanging over the end: PyTorch's rule)
        given = "" if x is None else f" of {_desc(x)}"
        raise ShapeError(f"{op}: kernel size {k} (dilation {d}) spans {span}, more than the "
                         f"input size {size}{given} padded by {p} on each side")
    return out


def _pool_args(op, kernel_size, stride, padding, dilation):
    kernel = ntuple(op, "kernel_size", kernel_size)
    stride = kernel if stride is None or stride == [] else ntuple(op, "stride", stride)
    padding, dilation = ntuple(op, "padding", padding), ntuple(op, "dilation", dilation)
    if min(kernel + stride + dilation) < 1 or min(padding) < 0:
        raise ValueError(f"{op}: kernel_size, stride and dilation must be positive and padding "
                         f"non-negative, got {kernel}, {stride}, {dilation}, {padding}")
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: pad should be at most half of effective kernel size, but got "
                         f"pad={list(padding)}, kernel_size={list(kernel)}")
    return kernel, stride, padding, dilation


def _planes(op, input, kernel, stride, padding, dilation, ceil_mode, fill):
    """(windows (N*C, OH, OW, kh*kw), (N, C, OH, OW), unbatched, x): every window of
    every plane, padded with `fill` (and past the end for ceil_mode)."""
    x, unbatched = batched(op, input, 4)
    need_float(op, x)
    n, c, h, w = x.shape
    if h == 0 or w == 0:
        raise ShapeError(f"{op}: expected a non-empty plane, got {_desc(input)}")
    outs = [pool_out(op, size, k, s, p, d, ceil_mode, input) for size, k, s, p, d in
            zip((h, w), kernel, stride, padding, dilation)]
    ends = [(o - 1) * s + d * (k - 1) + 1 - size - p for o, s, d, k, size, p in
            zip(outs, stride, dilation, kernel, (h, w), padding)]
    planes = reshape(x, n * c, 1, h, w)
    xp = pad2d(planes, padding[0], max(ends[0], padding[0]), padding[1],
               max(ends[1], padding[1]), fill)
    cols = unfold_windows(xp, kernel, dilation, stride)  # (N*C, OH, OW, 1, kh, kw)
    oh, ow = cols.shape[1:3]
    cols = reshape(cols, n * c, oh, ow, kernel[0] * kernel[1])
    return cols, (n, c, outs[0], outs[1]), unbatched, x


def _finish(t, shape, unbatched):
    t = reshape(t, *shape)
    return squeeze(t, 0) if unbatched else t


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over each window; with return_indices, also each maximum's flat index
    (h * W + w) in its input plane, as max_unpool2d takes them."""
    op = "max_pool2d"
    kernel, stride, padding, dilation = _pool_args(op, kernel_size, stride, padding, dilation)
    cols, shape, unbatched, x = _planes(op, input, kernel, stride, padding, dilation,
                                        ceil_mode, -math.inf)
    k = kernel[0] * kernel[1]
    first = _f.argmax(cols, 3, keepdim=True)  # the first max (or NaN) of each window
    inside = _first_inside(x.shape[2:], kernel, stride, padding, dilation, shape[2:])
    if inside is not None:  # a window of -inf values and padding: its first real element
        lost = _f.amax(cols, 3, keepdim=True) == -math.inf
        first = _f.where(lost, literal(inside), first)
    hit = first == literal(np.arange(k, dtype=np.int64))
    out = _finish(_f.sum(_f.where(hit, cols, 0.0), 3), shape, unbatched)
    if not return_indices:
        return out
    return out, _finish(_indices(first, x.shape[3], kernel, stride, padding, dilation,
                                 shape[2:]), shape, unbatched)


def _first_inside(hw, kernel, stride, padding, dilation, outs):
    """(OH, OW, 1) int64: each window's first element inside the input (PyTorch never
    picks padding), or None when no window reaches into padding."""
    rows, cols = (np.arange(o)[:, None] * s - p + np.arange(k)[None, :] * d
                  for o, s, p, k, d in zip(outs, stride, padding, kernel, dilation))
    real_r = (rows >= 0) & (rows < hw[0])  # (OH, kh)
    real_c = (cols >= 0) & (cols < hw[1])  # (OW, kw)
    real = real_r[:, None, :, None] & real_c[None, :, None, :]  # (OH, OW, kh, kw)
    real = real.reshape(outs[0], outs[1], -1)
    if real.all():
        return None
    return real.argmax(-1)[..., None].astype(np.int64)


def _indices(first, width, kernel, stride, padding, dilation, outs):
    """Flat input-plane indices of the picked window elements (int64, no gradient)."""
    ki, kj = np.divmod(np.arange(kernel[0] * kernel[1]), kernel[1])
    offsets = ki * dilation[0] * width + kj * dilation[1]
    oh = np.arange(outs[0]) * stride[0] - padding[0]
    ow = np.arange(outs[1]) * stride[1] - padding[1]
    base = (oh[:, None] * width + ow[None, :])[:, :, None]
    picked = apply("take", (literal(offsets.astype(np.int64)), first), {"dim": 0})
    return picked + literal(base.astype(np.int64))


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Mean over each window (the padding counted unless count_include_pad=False)."""
    op = "avg_pool2d"
    kernel, stride, padding, _ = _pool_args(op, kernel_size, stride, padding, 1)
    cols, shape, unbatched, x = _planes(op, input, kernel, stride, padding, (1, 1),
                                        ceil_mode, 0.0)
    if divisor_override is not None:
        if int(divisor_override) == 0:
            raise ValueError(f"{op}: divisor_override must be non-zero")
        scale = np.asarray(1.0 / int(divisor_override))
    else:
        counts = [_counts(size, o, k, s, p, count_include_pad) for size, o, k, s, p in
                  zip(x.shape[2:], shape[2:], kernel, stride, padding)]
        scale = 1.0 / np.multiply.outer(counts[0], counts[1])
    total = _f.sum(cols, 3)
    return _finish(total * literal(scale.astype(x._data.dtype)), shape, unbatched)


def _counts(size, outs, k, s, p, include_pad) -> np.ndarray:
    """PyTorch's avg_pool divisor factors along one dim."""
    start = np.arange(outs) * s - p
    end = np.minimum(start + k, size + p)
    if include_pad:
        return (end - start).astype(np.float64)
    return (np.minimum(end, size) - np.maximum(start, 0)).astype(np.float64)


def adaptive_avg_pool2d(input, output_size):
    """Mean over PyTorch's adaptive windows [floor(i*H/OH), ceil((i+1)*H/OH)); an output
    size of None keeps that dim. Written as averaging matrices: P_h @ x @ P_w.T."""
    op = "adaptive_avg_pool2d"
    x, unbatched = batched(op, input, 4)
    need_float(op, x)
    h, w = x.shape[2:]
    sizes = (output_size, output_size) if isinstance(output_size, (int, type(None))) \
        else tuple(output_size)
    if len(sizes) != 2:
        raise ValueError(f"{op}: output_size must be an int or a pair, got {output_size!r}")
    oh, ow = (h if sizes[0] is None else int(sizes[0]), w if sizes[1] is None else int(sizes[1]))
    if oh < 1 or ow < 1 or h == 0 or w == 0:
        raise ShapeError(f"{op}: cannot pool {_desc(input)} to {oh}x{ow}")
    if (oh, ow) == (1, 1):
        out = _f.mean(x, (2, 3), keepdim=True)
    elif h % oh == 0 and w % ow == 0:
        out = avg_pool2d(x, (h // oh, w // ow))
    else:
        dt = x._data.dtype
        out = literal(_averaging(h, oh, dt)) @ (x @ literal(_averaging(w, ow, dt).T.copy()))
    return squeeze(out, 0) if unbatched else out


def _averaging(size, outs, dtype) -> np.ndarray:
    m = np.zeros((outs, size))
    for i in range(outs):
        lo, hi = (i * size) // outs, -(-((i + 1) * size) // outs)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m.astype(dtype)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """max_pool2d over the last dim of a (N, C, L) or (C, L) input."""
    one = ntuple("max_pool1d", "kernel_size", kernel_size, 1)[0]
    res = max_pool2d(input.unsqueeze(-2), (1, one),
                     None if stride is None else (1, ntuple("max_pool1d", "stride", stride, 1)[0]),
                     (0, ntuple("max_pool1d", "padding", padding, 1)[0]),
                     (1, ntuple("max_pool1d", "dilation", dilation, 1)[0]), ceil_mode,
                     return_indices)
    if return_indices:
        return squeeze(res[0], -2), squeeze(res[1], -2)
    return squeeze(res, -2)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """avg_pool2d over the last dim of a (N, C, L) or (C, L) input."""
    one = ntuple("avg_pool1d", "kernel_size", kernel_size, 1)[0]
    res = avg_pool2d(input.unsqueeze(-2), (1, one),
                     None if stride is None else (1, ntuple("avg_pool1d", "stride", stride, 1)[0]),
                     (0, ntuple("avg_pool1d", "padding", padding, 1)[0]), ceil_mode,
                     count_include_pad)
    return squeeze(res, -2)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Normalize each channel (dim 1) over the batch and spatial dims. Training uses the
    batch's statistics and moves the running ones (when given) in place by `momentum`
    (a float, or a 0-d tensor): the mean, and the unbiased variance."""
    op = "batch_norm"
    if not isinstance(input, Tensor) or input.ndim < 2:
        raise ShapeError(f"{op}: expected an input of at least 2 dims (N, C, ...), got "
                         f"{getattr(input, 'shape', input)!r}")
    need_float(op, input, weight, bias)
    c = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise ShapeError(f"{op}: {name} {_desc(t)} must have shape [{c}] for input "
                             f"{_desc(input)}")
    bshape = (1, c) + (1,) * (input.ndim - 2)
    if training:
        count = input.numel() // max(c, 1)
        if count == 1:
            raise ValueError(f"{op}: expected more than 1 value per channel when training, got "
                             f"input size {list(input.shape)}")
        mean = _channel_mean(input, count)
        centered = input - mean
        var = _channel_mean(centered * centered, count)
        out = centered * _f.rsqrt(var + eps)
        if count:  # (an empty batch leaves the running statistics as they are)
            _move(running_mean, running_var, mean, var, momentum, count, c)
    else:
        if running_mean is None or running_var is None:
            raise ValueError(f"{op}: running_mean and running_var are needed when not training")
        out = (input - reshape(running_mean, *bshape)) * \
            _f.rsqrt(reshape(running_var, *bshape) + eps)
    if weight is not None:
        out = out * reshape(weight, *bshape)
    if bias is not None:
        out = out + reshape(bias, *bshape)
    return out


def _channel_mean(x, count):
    """Mean over every dim but 1, keepdim: the spatial dims first, then the batch (two
    shorter sums; compiled code adds in order, so one long sum over every element of a
    channel would lose digits in float32)."""
    if x.ndim > 2:
        x = _f.sum(x, tuple(range(2, x.ndim)), keepdim=True)
    total = _f.sum(x, 0, keepdim=True)
    return total / count if count else total * float("nan")


def _move(running_mean, running_var, mean, var, momentum, count, c):
    """running = (1 - momentum) * running + momentum * batch statistic, in place."""
    with no_grad():
        if running_mean is not None:
            running_mean.mul_(1.0 - momentum).add_(reshape(mean, c) * momentum)
        if running_var is not None:
            unbiased = reshape(var, c) * (count / (count - 1))
            running_var.mul_(1.0 - momentum).add_(unbiased * momentum)
