"""Convolutions as PyTorch defines them: conv1d, conv2d, conv_transpose2d, pad.

Each is a composition of primitives (docs/conv.md says why): padding is `pad_slice`,
the windows are `unfold` (im2col, compiler.ops_conv), and the multiply-adds are one
`matmul` whose rows are the output positions of the whole batch, so eager code makes
one BLAS call per layer and compiled code the same call, with the bias and activation
after it fused into one elementwise kernel. conv_transpose2d is the adjoint: a matmul
then `fold` (col2im). Gradients come from the primitives' vjps (unfold's is fold).
"""

import math

import numpy as np

from compiler.errors import DTypeError, ShapeError

from ..dispatch import apply
from ..shape import permute, reshape, squeeze, unsqueeze
from ..tensor import Tensor, literal


def _desc(t) -> str:
    return f"{t.dtype}{list(t.shape)}"


def ntuple(op: str, name: str, value, n: int = 2) -> tuple:
    """An int or a sequence of n ints as a tuple of n ints (PyTorch's _pair)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    try:
        out = tuple(int(v) for v in value)
    except TypeError:
        out = ()
    if len(out) != n:
        raise ValueError(f"{op}: {name} must be an int or {n} ints, got {value!r}")
    return out


def batched(op: str, input, ndim: int):
    """(input with a batch dim, was one added?): a (C, ...) input is one sample."""
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    if input.ndim == ndim:
        return input, False
    if input.ndim == ndim - 1:
        return unsqueeze(input, 0), True
    raise ShapeError(f"{op}: expected a {ndim - 1}-D (unbatched) or {ndim}-D (batched) input, "
                     f"got {_desc(input)}")


def need_float(op: str, *tensors):
    """Raise unless the tensors (None skipped) share one floating-point dtype."""
    given = [t for t in tensors if t is not None]
    first = given[0]
    if first._data.dtype.kind != "f":
        raise DTypeError(f"{op}: expected a floating-point input, got {_desc(first)}")
    for t in given[1:]:
        if t._data.dtype != first._data.dtype:
            raise DTypeError(f"{op}: input {_desc(first)} and {_desc(t)} must have the same "
                             "dtype (convert one with .to(dtype))")


def pad2d(x, top: int, bottom: int, left: int, right: int, fill: float = 0.0):
    """x (N, C, H, W) padded with `fill` around its last two dims (`pad`)."""
    return pad(x, (left, right, top, bottom), value=fill)


def unfold_windows(x, kernel, dilation, stride):
    """The (N, OH, OW, C, kh, kw) windows of a padded (N, C, H, W) input."""
    return apply("unfold", (x,), {"kernel": tuple(kernel), "dilation": tuple(dilation),
                                  "stride": tuple(stride)})


def _conv_padding(op, padding, kernel, dilation, stride) -> tuple:
    """(top, bottom, left, right) for an int, a pair, 'valid' or 'same'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(f"{op}: padding must be 'valid', 'same', an int or a pair, got "
                             f"{padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
        out = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            out += [total // 2, total - total // 2]  # the odd one at the end, as PyTorch
        return tuple(out)
    ph, pw = ntuple(op, "padding", padding)
    if ph < 0 or pw < 0:
        raise ValueError(f"{op}: padding must be non-negative, got {padding!r}")
    return (ph, ph, pw, pw)


def _check_conv(op, x, weight, bias, groups):
    if not isinstance(weight, Tensor) or weight.ndim != x.ndim:
        raise ShapeError(f"{op}: weight must be a {x.ndim}-D (out_channels, in_channels/groups, "
                         f"kernel...) tensor, got {getattr(weight, 'shape', weight)!r}")
    need_float(op, x, weight, bias)
    out_c, in_per_group = weight.shape[:2]
    if int(groups) < 1 or out_c % groups:
        raise ValueError(f"{op}: groups={groups} must be positive and divide out_channels "
                         f"(weight {_desc(weight)})")
    if x.shape[1] != in_per_group * groups:
        raise ShapeError(f"{op}: given groups={groups}, weight of size {list(weight.shape)}, "
                         f"expected input {list(x.shape)} to have {in_per_group * groups} "
                         f"channels, but got {x.shape[1]} channels instead")
    if bias is not None and tuple(bias.shape) != (out_c,):
        raise ShapeError(f"{op}: bias {_desc(bias)} must have shape [{out_c}]")


def _product(cols, weight, groups):
    """(N, OH, OW, C, kh, kw) windows times a (O, C/g, kh, kw) weight -> (N, OH, OW, O)."""
    n, oh, ow = cols.shape[:3]
    out_c, ck = weight.shape[0], math.prod(cols.shape[3:])  # (sizes spelt out: N may be 0)
    if groups == 1:
        # one 2-D product over the batch's rows: its weight gradient is one product too
        # (a batched one would be a product per sample, then a sum)
        rows = reshape(cols, n * oh * ow, ck)
        return reshape(rows @ reshape(weight, out_c, ck).T, n, oh, ow, out_c)
    per = ck // groups
    rows = permute(reshape(cols, n, oh * ow, groups, per), 0, 2, 1, 3)  # (N, G, L, CgK)
    w = permute(reshape(weight, groups, out_c // groups, per), 0, 2, 1)  # (G, CgK, Og)
    return reshape(permute(rows @ w, 0, 2, 1, 3), n, oh, ow, out_c)


def _conv2d(op, input, weight, bias, stride, padding, dilation, groups):
    x, unbatched = batched(op, input, 4)
    _check_conv(op, x, weight, bias, groups)
    stride, dilation = ntuple(op, "stride", stride), ntuple(op, "dilation", dilation)
    if min(stride + dilation) < 1:
        raise ValueError(f"{op}: stride and dilation must be positive, got {stride}, {dilation}")
    kernel = tuple(weight.shape[2:])
    top, bottom, left, right = _conv_padding(op, padding, kernel, dilation, stride)
    xp = pad2d(x, top, bottom, left, right)
    _check_fits(op, x, xp, weight, dilation, (top + bottom, left + right))
    cols = unfold_windows(xp, kernel, dilation, stride)
    out = permute(_product(cols, weight, int(groups)), 0, 3, 1, 2)
    if bias is not None:
        out = out + reshape(bias, -1, 1, 1)
    return squeeze(out, 0) if unbatched else out


def _check_fits(op, x, xp, weight, dilation, pads):
    kernel = weight.shape[2:]
    for size, k, d in zip(xp.shape[2:], kernel, dilation):
        if d * (k - 1) + 1 > size:
            raise ShapeError(f"{op}: kernel size {list(kernel)} (dilation {list(dilation)}) of "
                             f"weight {_desc(weight)} is larger than the input {_desc(x)} "
                             f"padded by {list(pads)} ({xp.shape[2]}x{xp.shape[3]})")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation) of a (N, C, H, W) or (C, H, W) input with a
    (O, C/groups, kh, kw) weight; padding is an int, a pair, 'valid' or 'same'."""
    return _conv2d("conv2d", input, weight, bias, stride, padding, dilation, groups)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution of a (N, C, L) or (C, L) input with a (O, C/groups, k) weight."""
    x, unbatched = batched("conv1d", input, 3)
    _check_conv("conv1d", x, weight, bias, groups)
    stride = ntuple("conv1d", "stride", stride, 1)[0]
    dilation = ntuple("conv1d", "dilation", dilation, 1)[0]
    if not isinstance(padding, str):
        padding = (0, ntuple("conv1d", "padding", padding, 1)[0])
    pads = _conv_padding("conv1d", padding, (1,) + weight.shape[2:], (1, dilation), (1, stride))
    span = dilation * (weight.shape[2] - 1) + 1
    if x.shape[2] + pads[2] + pads[3] < span:
        raise ShapeError(f"conv1d: kernel size {weight.shape[2]} (dilation {dilation}) of "
                         f"weight {_desc(weight)} is larger than the input {_desc(input)} "
                         f"padded by {pads[2] + pads[3]}")
    out = _conv2d("conv1d", unsqueeze(x, 2), unsqueeze(weight, 2), bias, (1, stride), padding,
                  (1, dilation), groups)
    out = squeeze(out, 2)
    return squeeze(out, 0) if unbatched else out


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1):
    """The adjoint of conv2d (a 'deconvolution'): a (N, C, H, W) input and a
    (C, O/groups, kh, kw) weight give (N, O, (H-1)*s - 2p + d*(k-1) + output_padding + 1, ...)."""
    op = "conv_transpose2d"
    x, unbatched = batched(op, input, 4)
    if not isinstance(weight, Tensor) or weight.ndim != 4:
        raise ShapeError(f"{op}: weight must be a 4-D (in_channels, out_channels/groups, kh, kw) "
                         f"tensor, got {getattr(weight, 'shape', weight)!r}")
    need_float(op, x, weight, bias)
    groups = int(groups)
    in_c, out_per_group, kh, kw = weight.shape
    if groups < 1 or in_c % groups:
        raise ValueError(f"{op}: groups={groups} must be positive and divide in_channels "
                         f"(weight {_desc(weight)})")
    if x.shape[1] != in_c:
        raise ShapeError(f"{op}: weight {_desc(weight)} expects {in_c} input channels, got "
                         f"input {_desc(x)}")
    stride, dilation = ntuple(op, "stride", stride), ntuple(op, "dilation", dilation)
    pad, extra = ntuple(op, "padding", padding), ntuple(op, "output_padding", output_padding)
    for s, d, e in zip(stride, dilation, extra):
        if min(s, d) < 1 or e < 0 or (e >= s and e >= d):
            raise ValueError(f"{op}: output_padding {list(extra)} must be smaller than either "
                             f"stride {list(stride)} or dilation {list(dilation)}")
    out_c = out_per_group * groups
    if bias is not None and tuple(bias.shape) != (out_c,):
        raise ShapeError(f"{op}: bias {_desc(bias)} must have shape [{out_c}]")
    n, _, h, w = x.shape
    cols = _transposed_cols(x, weight, groups)  # (N, H, W, O, kh, kw)
    full = tuple((i - 1) * s + d * (k - 1) + 1 for i, s, d, k in
                 zip((h, w), stride, dilation, (kh, kw)))
    y = apply("fold", (cols,), {"size": full, "kernel": (kh, kw), "dilation": dilation,
                                "stride": stride})
    y = _crop(op, y, full, pad, extra)
    if bias is not None:
        y = y + reshape(bias, -1, 1, 1)
    return squeeze(y, 0) if unbatched else y


def _transposed_cols(x, weight, groups):
    n, in_c, h, w = x.shape
    _, out_g, kh, kw = weight.shape
    rows = permute(x, 0, 2, 3, 1)  # (N, H, W, C)
    width = out_g * kh * kw
    if groups == 1:
        cols = reshape(rows, n * h * w, in_c) @ reshape(weight, in_c, width)
    else:
        rows = permute(reshape(rows, n, h * w, groups, in_c // groups), 0, 2, 1, 3)
        cols = permute(rows @ reshape(weight, groups, in_c // groups, width), 0, 2, 1, 3)
    return reshape(cols, n, h, w, out_g * groups, kh, kw)


def _crop(op, y, full, pad, extra):
    """Rows [p, full - p + extra) of each spatial dim (zeros past the end)."""
    want = [f - 2 * p + e for f, p, e in zip(full, pad, extra)]
    if min(want) < 1:
        raise ShapeError(f"{op}: padding {list(pad)} leaves no output from a {full[0]}x{full[1]} "
                         "result")
    grow = [max(0, p + n - f) for p, n, f in zip(pad, want, full)]
    y = pad2d(y, 0, grow[0], 0, grow[1])
    n, c = y.shape[:2]
    index = ((0, n, 1), (0, c, 1), (pad[0], pad[0] + want[0], 1), (pad[1], pad[1] + want[1], 1))
    return apply("slice", (y,), {"index": index})


def pad(input, pad, mode: str = "constant", value=None):
    """Pad the last len(pad)//2 dims: pad = (left, right) of the last dim, then the one
    before, ... Constant mode only; negative amounts crop."""
    if mode != "constant":
        raise NotImplementedError(f"pad: mode {mode!r} is not supported yet; only 'constant'")
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ValueError(f"pad: padding length {len(pad)} must be even and at most twice the "
                         f"number of dims of {_desc(input)}")
    grow, crop = [], []
    for i, size in enumerate(input.shape):
        j = 2 * (input.ndim - 1 - i)
        lo, hi = (pad[j], pad[j + 1]) if j < len(pad) else (0, 0)
        if size + min(lo, 0) + min(hi, 0) < 0:
            raise ValueError(f"pad: {pad} crops {-min(lo, 0) - min(hi, 0)} elements from dim "
                             f"{i} of {_desc(input)}, which has {size}")
        grow.append((max(lo, 0), max(hi, 0)))
        crop.append((max(-lo, 0), size - max(-hi, 0)))
    x = input
    if any(c != (0, s) for c, s in zip(crop, input.shape)):
        x = apply("slice", (x,), {"index": tuple((a, b, 1) for a, b in crop)})
    if not any(lo or hi for lo, hi in grow):
        return x
    shape = tuple(s + lo + hi for s, (lo, hi) in zip(x.shape, grow))
    index = tuple((lo, lo + s, 1) for s, (lo, _) in zip(x.shape, grow))
    out = apply("pad_slice", (x,), {"shape": shape, "index": index})
    if value is None or (value == 0 and not np.signbit(value)):
        return out
    # (the border mask broadcasts along the dims that are not padded)
    grown = [bool(lo or hi) for lo, hi in grow]
    border = np.ones(tuple(n if g else 1 for n, g in zip(shape, grown)), dtype=bool)
    border[tuple(slice(a, b) if g else slice(None) for (a, b, _), g in zip(index, grown))] = False
    return apply("where", (literal(border), out._data.dtype.type(value), out))


def conv_fan_in(weight) -> int:
    """fan_in of a conv weight: its dim 1 times the kernel's size (PyTorch's rule)."""
    return weight.shape[1] * math.prod(weight.shape[2:])
