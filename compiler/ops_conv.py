"""Sliding windows: `unfold` (im2col) and `fold` (col2im), the two primitives that
convolution, transposed convolution and pooling are composed of (hybridnet.nn.conv).

unfold(x) with x of shape (N, C, H, W) gives (N, OH, OW, C, kh, kw): for every output
position, the window of every channel, in the order a (O, C, kh, kw) weight flattens
to. So `unfold(x).reshape(N, OH*OW, C*kh*kw) @ w.reshape(O, -1).T` is a convolution in
one matrix product with no copy between the two, and the product's rows are the output
positions, so a batch is one BLAS call over N*OH*OW rows. fold is unfold's adjoint: it
adds each window back where it came from (overlaps sum), so each is the other's vjp.
Padding is not theirs: the caller pads with pad_slice (zeros) or whatever fill it needs.
"""

import numpy as np

from .errors import ShapeError, describe
from .registry import OpDef, Trait, register

_PURE = frozenset({Trait.PURE})
_NONE = frozenset()


def out_size(size: int, k: int, d: int, s: int) -> int:
    """Windows of extent d*(k-1)+1 at stride s that fit in `size` (0 when none fits)."""
    span = d * (k - 1) + 1
    return (size - span) // s + 1 if size >= span else 0


def _check_attrs(op, kernel, dilation, stride):
    for name, pair in (("kernel", kernel), ("dilation", dilation), ("stride", stride)):
        if len(pair) != 2 or any(int(v) < 1 for v in pair):
            raise ShapeError(f"{op}: {name} must be two positive integers, got {list(pair)}")


def _windows(op, shapes, dtypes, hw, kernel, dilation, stride):
    """(OH, OW) of windows over a (H, W) plane, or a ShapeError naming everything."""
    _check_attrs(op, kernel, dilation, stride)
    ohw = tuple(out_size(n, k, d, s) for n, k, d, s in zip(hw, kernel, dilation, stride))
    if 0 in ohw:
        span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
        raise ShapeError(f"{op}: kernel {list(kernel)} with dilation {list(dilation)} spans "
                         f"{span[0]}x{span[1]}, larger than the (padded) input plane "
                         f"{hw[0]}x{hw[1]} of {describe(shapes, dtypes)}")
    return ohw


def _unfold_rule(shapes, dtypes, kernel, dilation, stride):
    shape = tuple(shapes[0])
    if len(shape) != 4:
        raise ShapeError(f"unfold: expected a 4-D (N, C, H, W) input, got "
                         f"{describe(shapes, dtypes)}")
    n, c, h, w = shape
    oh, ow = _windows("unfold", shapes, dtypes, (h, w), kernel, dilation, stride)
    return (n, oh, ow, c, kernel[0], kernel[1]), dtypes[0]


def _window_view(x, kernel, dilation, stride):
    """The (N, OH, OW, C, kh, kw) windows of x as a strided view (no copy)."""
    n, c, h, w = x.shape
    (kh, kw), (dh, dw), (sh, sw) = kernel, dilation, stride
    oh, ow = out_size(h, kh, dh, sh), out_size(w, kw, dw, sw)
    sn, sc, sy, sx = x.strides
    return np.lib.stride_tricks.as_strided(
        x, (n, oh, ow, c, kh, kw), (sn, sy * sh, sx * sw, sc, sy * dh, sx * dw),
        writeable=False)


def _unfold_impl(x, kernel, dilation, stride):
    return np.ascontiguousarray(_window_view(x, kernel, dilation, stride))


def _fold_rule(shapes, dtypes, size, kernel, dilation, stride):
    shape = tuple(shapes[0])
    if len(shape) != 6 or len(size) != 2:
        raise ShapeError(f"fold: expected (N, OH, OW, C, kh, kw) windows and a 2-D size, got "
                         f"{describe(shapes, dtypes)} and size {list(size)}")
    n, oh, ow, c, kh, kw = shape
    if (kh, kw) != tuple(kernel):
        raise ShapeError(f"fold: windows of {kh}x{kw} do not match kernel {list(kernel)}")
    want = _windows("fold", shapes, dtypes, tuple(size), kernel, dilation, stride)
    if want != (oh, ow):
        raise ShapeError(f"fold: {oh}x{ow} windows do not tile an output of size "
                         f"{list(size)} (which has {want[0]}x{want[1]}): "
                         f"{describe(shapes, dtypes)}")
    return (n, c, size[0], size[1]), dtypes[0]


def _fold_impl(cols, size, kernel, dilation, stride):
    n, oh, ow, c, kh, kw = cols.shape
    out = np.zeros((n, c) + tuple(size), dtype=cols.dtype)
    (dh, dw), (sh, sw) = dilation, stride
    planes = cols.transpose(0, 3, 4, 5, 1, 2)  # (N, C, kh, kw, OH, OW)
    for i in range(kh):
        rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
        for j in range(kw):
            out[:, :, rows, j * dw:j * dw + sw * (ow - 1) + 1:sw] += planes[:, :, i, j]
    return out


def _attrs(a):
    return {"kernel": a["kernel"], "dilation": a["dilation"], "stride": a["stride"]}


register(OpDef(
    "unfold", 1, _unfold_impl, _unfold_rule,
    vjp=(lambda e, g, x, o, a: e("fold", g, size=tuple(x[0].shape[2:]), **_attrs(a)),),
    attrs=("kernel", "dilation", "stride"), traits=_PURE, saves=_NONE, zeros="first",
    doc="im2col: the (N, OH, OW, C, kh, kw) sliding windows of a (N, C, H, W) input"))

register(OpDef(
    "fold", 1, _fold_impl, _fold_rule,
    vjp=(lambda e, g, x, o, a: e("unfold", g, **_attrs(a)),),
    attrs=("size", "kernel", "dilation", "stride"), traits=_PURE, saves=_NONE,
    zeros="first",
    doc="col2im: (N, OH, OW, C, kh, kw) windows added back into a (N, C, H, W) output"))
