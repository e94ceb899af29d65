"""ONNX converters of the window and scan primitives (unfold, fold, cumsum, argsort),
kept apart from compiler.export.onnx_export, whose CONVERTERS table takes them in."""

import numpy as np

from .onnx_common import _I32, _I64, _is_bool, _norm


def _window_index(hw, kernel, dilation, stride) -> np.ndarray:
    """The (OH, OW, kh, kw) int64 flat positions in a (H, W) plane that unfold reads:
    (i*sh + p*dh) * W + (j*sw + q*dw) for window (i, j), offset (p, q)."""
    (h, w), (kh, kw), (dh, dw), (sh, sw) = hw, kernel, dilation, stride
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    rows = np.arange(oh)[:, None] * sh + np.arange(kh)[None, :] * dh  # (OH, kh)
    cols = np.arange(ow)[:, None] * sw + np.arange(kw)[None, :] * dw  # (OW, kw)
    flat = rows[:, None, :, None] * w + cols[None, :, None, :]
    return flat.astype(np.int64)


def _window_attrs(node):
    return tuple(tuple(int(v) for v in node.attrs[k]) for k in ("kernel", "dilation", "stride"))


def _unfold(b, node, ins):
    """Gather of the (OH, OW, kh, kw) window positions (an int64 initializer) from the
    (N, C, H*W) planes (Reshape), then Transpose (N, C, OH, OW, kh, kw) to
    (N, OH, OW, C, kh, kw)."""
    n, c, h, w = node.inputs[0].shape
    index = _window_index((h, w), *_window_attrs(node))
    flat = b.emit("Reshape", [ins[0], b.ints([n, c, h * w])], allowzero=1)
    windows = b.emit("Gather", [flat, b.const(index)], axis=2)
    return b.emit("Transpose", [windows], perm=[0, 2, 3, 1, 4, 5])


def _fold(b, node, ins):
    """unfold's adjoint: Transpose the windows to (N, C, OH, OW, kh, kw), Reshape to
    (N, C, L), ScatterElements(reduction="add") along axis 2 onto ConstantOfShape zeros
    (N, C, H*W) at the window positions (an int64 initializer, Expand-ed to (N, C, L)),
    Reshape to (N, C, H, W). Overlapping windows add, as NumPy's fold; bool adds
    (logical or) in int32."""
    n, oh, ow, c, kh, kw = node.inputs[0].shape
    h, w = (int(v) for v in node.attrs["size"])
    index = _window_index((h, w), *_window_attrs(node)).reshape(1, 1, -1)
    length = index.shape[-1]
    work = _I32 if _is_bool(node.dtype) else node.dtype
    cols = ins[0] if work == node.dtype else b.cast(ins[0], work)
    cols = b.emit("Transpose", [cols], perm=[0, 3, 1, 2, 4, 5])
    cols = b.emit("Reshape", [cols, b.ints([n, c, length])], allowzero=1)
    indices = b.emit("Expand", [b.const(index), b.ints([n, c, length])])
    out = b.emit("ScatterElements", [b.zeros([n, c, h * w], work), indices, cols],
                 axis=2, reduction="add")
    out = b.emit("Reshape", [out, b.ints([n, c, h, w])], allowzero=1)
    return b.cast(out, node.dtype) if work != node.dtype else out


def _cumsum(b, node, ins):
    """CumSum along the (normalized) dim; a 0-d input is its own sum."""
    x = node.inputs[0]
    if not x.shape:
        return b.emit("Identity", ins)
    axis = b.const(np.asarray(_norm(node.attrs["dim"], len(x.shape)), np.int64))
    return b.emit("CumSum", [ins[0], axis])


def _argsort(b, node, ins):
    """TopK over the whole dim (k = its size), sorted, its indices: ties keep the lower
    index first, which is the stable order both ways (largest=1 for descending)."""
    x = node.inputs[0]
    if not x.shape:
        return b.scalar(0, _I64)
    axis = _norm(node.attrs["dim"], len(x.shape))
    value = b.cast(ins[0], _I32) if _is_bool(x.dtype) else ins[0]
    k = b.ints([x.shape[axis]])
    values, indices = b.fresh(b.prefix), b.fresh(b.prefix)
    b.made.update((values, indices))
    b.nodes.append(b.onnx.helper.make_node(
        "TopK", [value, k], [values, indices], name=indices, axis=axis,
        largest=int(bool(node.attrs["descending"])), sorted=1))
    return indices


MORE_CONVERTERS = {"unfold": _unfold, "fold": _fold, "cumsum": _cumsum, "argsort": _argsort}
