"""unfold (im2col) and fold (col2im) in the llvm backend (compiler.ops_conv).

unfold copies a strided view of its source (windows overlap, so the view has strides
(sN, sH*sh, sW*sw, sC, sH*dh, sW*dw)) into a new contiguous buffer; the reshape a
convolution takes next is then free. fold adds each window element into a zeroed
output, in the order of the windows (as eager does, window by window)."""

from ..ir import pad_shape as _pad
from . import llvm_scalar as S
from .llvm_buf import I64, Buf


def unfold(em, node):
    src = em.buffer(node.inputs[0])
    (dh, dw), (sh, sw) = node.attrs["dilation"], node.attrs["stride"]
    sn, sc, sy, sx = src.strides
    view = Buf(src.slot, src.dtype, _pad(node.shape),
               (sn, sy * sh, sx * sw, sc, sy * dh, sx * dw), src.offset)
    em.copy(em.new_buffer(node), view)


def fold(em, node):
    out = em.new_buffer(node)
    em.fill(out, S.constant(0, node.dtype))
    cols = em.buffer(node.inputs[0])
    (dh, dw), (sh, sw) = node.attrs["dilation"], node.attrs["stride"]
    b = em.b

    def body(idx):
        a, i, j, ch, p, q = idx
        row = b.add(b.mul(i, I64(sh)), b.mul(p, I64(dh)))
        col = b.add(b.mul(j, I64(sw)), b.mul(q, I64(dw)))
        at = [a, ch, row, col]
        total = S.RULES["add"](b, [em.load(out, at), em.load(cols, idx)], node, em)
        em.store(out, at, total)
    em.each(cols.shape, body)
