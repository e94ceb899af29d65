"""Numba lowering of cumsum (a running sum per row) and argsort (Numba's stable
mergesort per row; descending sorts the reversed row so that ties keep their order),
over the (before, dim, after) blocks of a contiguous copy (compiler.ops_sort)."""

import numpy as np


def _blocks(shape, dim):
    if not shape:
        return 1, 1, 1
    before = int(np.prod(shape[:dim])) if dim else 1
    after = int(np.prod(shape[dim + 1:])) if dim + 1 < len(shape) else 1
    return before, shape[dim], after


def _shape(node) -> str:
    parts = [str(s) for s in node.shape] or ["1"]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def cumsum(em, node, x):
    """out[p, q, r] = out[p, q - 1, r] + x[p, q, r]."""
    em.ctx.shape_generic = False
    v = em.ctx.var(node)
    a, n, b = _blocks(tuple(node.shape), node.attrs["dim"])
    em.emit(f"{v}_x = np.ascontiguousarray({x}).reshape(({a}, {n}, {b}))")
    em.emit(f"{v}_o = np.empty(({a}, {n}, {b}), np.{node.dtype.name})")
    em.emit(f"for p in range({a if n else 0}):")
    em.emit(f"    for r in range({b}):")
    em.emit(f"        {v}_s = {v}_x[p, 0, r]")
    em.emit(f"        {v}_o[p, 0, r] = {v}_s")
    em.emit(f"        for q in range(1, {n}):")
    em.emit(f"            {v}_s = {v}_s + {v}_x[p, q, r]")
    em.emit(f"            {v}_o[p, q, r] = {v}_s")
    em.emit(f"{v} = {v}_o.reshape({_shape(node)})")


def argsort(em, node, x):
    """Each row's stable order (descending: of the reversed row, mapped back)."""
    em.ctx.shape_generic = False
    v = em.ctx.var(node)
    a, n, b = _blocks(tuple(node.inputs[0].shape), node.attrs["dim"])
    em.emit(f"{v}_x = np.ascontiguousarray({x}).reshape(({a}, {n}, {b}))")
    em.emit(f"{v}_o = np.empty(({a}, {n}, {b}), np.int64)")
    em.emit(f"for p in range({a}):")
    em.emit(f"    for r in range({b}):")
    if node.attrs["descending"]:
        em.emit(f"        {v}_k = np.argsort({v}_x[p, ::-1, r].copy(), kind='mergesort')")
        em.emit(f"        for q in range({n}):")
        em.emit(f"            {v}_o[p, {n} - 1 - q, r] = {n} - 1 - {v}_k[q]")
    else:
        em.emit(f"        {v}_k = np.argsort({v}_x[p, :, r].copy(), kind='mergesort')")
        em.emit(f"        for q in range({n}):")
        em.emit(f"            {v}_o[p, q, r] = {v}_k[q]")
    em.emit(f"{v} = {v}_o.reshape({_shape(node)})")
