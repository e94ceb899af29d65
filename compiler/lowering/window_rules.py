"""Numba lowering of the sliding-window primitives unfold (im2col) and fold (col2im):
one loop nest over (N, OH, OW, C, kh, kw), sizes as traced (compiler.ops_conv)."""


def _loops(em, node_shape, body):
    """Emit nested `for` loops over the six window dims around the line `body`."""
    names = ("a", "i", "j", "ch", "p", "q")
    for depth, (name, size) in enumerate(zip(names, node_shape)):
        em.emit("    " * depth + f"for {name} in range({size}):")
    em.emit("    " * len(names) + body)


def _at(node):
    (dh, dw), (sh, sw) = node.attrs["dilation"], node.attrs["stride"]
    return f"a, ch, i * {sh} + p * {dh}, j * {sw} + q * {dw}"


def unfold(em, node, x):
    """out[a, i, j, ch, p, q] = x[a, ch, i*sh + p*dh, j*sw + q*dw]."""
    em.ctx.shape_generic = False
    v = em.ctx.var(node)
    em.emit(f"{v}_x = np.ascontiguousarray({x})")
    em.emit(f"{v} = np.empty({tuple(node.shape)}, np.{node.dtype.name})")
    _loops(em, node.shape, f"{v}[a, i, j, ch, p, q] = {v}_x[{_at(node)}]")


def fold(em, node, cols):
    """out[a, ch, i*sh + p*dh, j*sw + q*dw] += cols[a, i, j, ch, p, q] (from zeros)."""
    em.ctx.shape_generic = False
    v = em.ctx.var(node)
    em.emit(f"{v}_c = np.ascontiguousarray({cols})")
    em.emit(f"{v} = np.zeros({tuple(node.shape)}, np.{node.dtype.name})")
    _loops(em, node.inputs[0].shape, f"{v}[{_at(node)}] += {v}_c[a, i, j, ch, p, q]")
