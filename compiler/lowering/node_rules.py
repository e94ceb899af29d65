"""Lowering of ops that are not fused into loops: matmul, movement, gather, arg-reductions.

Each rule appends lines defining the node's array variable. Rules that need a
size known only at trace time mark the program as not shape-generic.
"""

import numpy as np

from .. import blas
from ..errors import LoweringError
from ..ir import pad_shape as _pad
from ..loop import is_loop, traced_trip
from ..registry import REGISTRY
from .loop_rule import emit_loop, emit_loop_out
from .rules import is_reduction
from .scan_rules import argsort, cumsum
from .window_rules import fold, unfold


def _tuple(parts) -> str:
    parts = [str(p) for p in parts] or ["1"]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _static(em):
    em.ctx.shape_generic = False


def _reshape(em, node, x):
    _static(em)
    shape = list(_pad(node.shape))
    if len(shape) > 1 and all(shape[1:]):
        # (the leading size from the element count: the same code serves another length
        # of a leading dim, e.g. the steps of a loop's sequence, jit/dynamic.py)
        shape[0] = -1
    em.emit(f"{em.ctx.var(node)} = np.ascontiguousarray({x}).reshape({_tuple(shape)})")


def _permute(em, node, x):
    # A strided view. (np.transpose with axes costs Numba seconds to compile; as_strided
    # and .T a tenth of that.)
    v, dims = em.ctx.var(node), tuple(node.attrs["dims"])
    if dims == tuple(range(len(dims))):
        em.emit(f"{v} = {x}")
        return
    if dims == tuple(range(len(dims)))[::-1]:
        em.emit(f"{v} = {x}.T")
        return
    em.emit(f"{v}_x = {x}")
    shape = _tuple(f"{v}_x.shape[{d}]" for d in dims)
    strides = _tuple(f"{v}_x.strides[{d}]" for d in dims)
    em.emit(f"{v} = np.lib.stride_tricks.as_strided({v}_x, {shape}, {strides})")


def _slice(em, node, x):
    _static(em)
    v = em.ctx.var(node)
    em.emit(f"{v}_x = {x}")
    index, shape = node.attrs["index"], node.inputs[0].shape
    # A kernel shared by calls of other lengths (hybridnet.jit.dynamic) must not slice past
    # a shorter input's end (NumPy would clip; that call runs eagerly instead). A slice
    # that ends where its dim ends is written from the end (x[-1] of any length reads the
    # same code).
    need = [f"{v}_x.shape[{d}] < {size - a if size - b < a else b}"
            for d, ((a, b, _), size) in enumerate(zip(index, shape)) if b > 1]
    if need:
        em.emit(f"if {' or '.join(need)}:")
        em.emit("    raise ValueError('hn-loop: a slice reaches past a shorter input')")
    em.emit(f"{v} = {v}_x[{em.ctx.anchored_slice(f'{v}_x', index, shape)}]")


def _pad_slice(em, node, x):
    _static(em)
    v = em.ctx.var(node)
    em.emit(f"{v} = np.zeros({_tuple(_pad(node.shape))}, np.{node.dtype.name})")
    # element by element: an array assigned into a strided slice compiles ~10x slower
    em.emit(f"{v}_w, {v}_x = {v}[{em.ctx.slice_text(node.attrs['index'])}], {x}")
    em.emit(f"for {v}_q in np.ndindex({v}_x.shape):")
    em.emit(f"    {v}_w[{v}_q] = {v}_x[{v}_q]")


def _cat(em, node, *xs):
    em.emit(f"{em.ctx.var(node)} = np.concatenate(({', '.join(xs)},), axis={node.attrs['dim']})")


def _blas_operand(em, node, expr) -> str:
    """A contiguous operand for np.dot; a transposed matrix (x @ W.T) is passed as the
    F-ordered view of its C-ordered source, so BLAS transposes instead of copying."""
    if node.op == "permute" and tuple(node.attrs["dims"]) == (1, 0):
        return f"np.ascontiguousarray({em.array_of(node.inputs[0])}).T"
    return f"np.ascontiguousarray({expr})"


def _int_dot(em, a, b, out, q=""):
    """Lines for out[q] += a[q] @ b[q] with integer loops (NumPy's exact wrap-around)."""
    em.emit(f"for i in range({a}.shape[-2]):")
    em.emit(f"    for k in range({a}.shape[-1]):")
    em.emit(f"        {out}_t = {a}[{q}i, k]")
    em.emit(f"        for j in range({b}.shape[-1]):")
    em.emit(f"            {out}[{q}i, j] += {out}_t * {b}[{q}k, j]")


def _matmul(em, node, a, b):
    kind = node.dtype.kind
    if kind not in "fiu":
        raise LoweringError(f"matmul on {node.dtype} is run eagerly")
    v, dt = em.ctx.var(node), f"np.{node.dtype.name}"
    if len(node.shape) == 2:
        if kind == "f":
            em.ctx.uses_blas = True
            em.emit(f"{v} = np.dot({_blas_operand(em, node.inputs[0], a)}, "
                    f"{_blas_operand(em, node.inputs[1], b)})")
            return
        em.emit(f"{v}_a, {v}_b = {a}, {b}")
        em.emit(f"{v} = np.zeros(({v}_a.shape[0], {v}_b.shape[1]), {dt})")
        _int_dot(em, f"{v}_a", f"{v}_b", v)
        return
    if kind == "f" and len(node.inputs[1].shape) == 2 and node.inputs[0].shape[-1]:
        # (batch, ..., k) @ (k, n): one product over all the rows, no copies of b per
        # item, and no size named (so the code serves other batch sizes and lengths;
        # an empty inner dim takes the loop below: the -1 could not be worked out)
        em.ctx.uses_blas = True
        em.emit(f"{v}_a = np.ascontiguousarray({a})")
        em.emit(f"{v}_p = np.dot({v}_a.reshape((-1, {v}_a.shape[-1])), "
                f"{_blas_operand(em, node.inputs[1], b)})")
        em.emit(f"{v} = {v}_p.reshape({v}_a.shape[:-1] + ({v}_p.shape[1],))")
        return
    _static(em)
    batch = node.shape[:-2]
    em.emit(f"{v} = np.{'empty' if kind == 'f' else 'zeros'}({_tuple(node.shape)}, {dt})")
    em.emit(f"{v}_a = np.ascontiguousarray(np.broadcast_to({a}, "
            f"{_tuple(batch + node.inputs[0].shape[-2:])}))")
    em.emit(f"{v}_b = np.ascontiguousarray(np.broadcast_to({b}, "
            f"{_tuple(batch + node.inputs[1].shape[-2:])}))")
    em.emit(f"{v}_f = {v}.reshape((-1,) + {v}.shape[-2:])")
    em.emit(f"{v}_af = {v}_a.reshape((-1,) + {v}_a.shape[-2:])")
    em.emit(f"{v}_bf = {v}_b.reshape((-1,) + {v}_b.shape[-2:])")
    if kind != "f":
        em.emit(f"{v}_n = {v}_f.shape[0]")
        em.emit(f"for q in range({v}_n):")
        em.lines.extend("    " + line for line in _lines(em, lambda: _int_dot(
            em, f"{v}_af", f"{v}_bf", f"{v}_f", "q, ")))
        return
    em.ctx.uses_blas = True
    em.emit(f"for q in range({v}_f.shape[0]):")
    # dot's out= form: assigning a 2-d result into a slice compiles ~10x slower in Numba
    em.emit(f"    np.dot({v}_af[q], {v}_bf[q], {v}_f[q])")


def _lines(em, emit) -> list:
    """The lines `emit()` appends, taken back out (to re-indent them)."""
    n = len(em.lines)
    emit()
    lines = em.lines[n:]
    del em.lines[n:]
    return lines


def _three_way(shape, dim):
    before = int(np.prod(shape[:dim])) if dim else 1
    after = int(np.prod(shape[dim + 1:])) if dim + 1 < len(shape) else 1
    return before, shape[dim], after


def _take(em, node, x, idx):
    _static(em)
    v, dim = em.ctx.var(node), node.attrs["dim"]
    src, ind = node.inputs
    a, n, b = _three_way(_pad(src.shape), dim)
    m = int(np.prod(ind.shape)) if len(ind.shape) else 1
    em.emit(f"{v}_x = np.ascontiguousarray({x}).reshape(({a}, {n}, {b}))")
    em.emit(f"{v}_i = np.ascontiguousarray({idx}).reshape(({m},))")
    em.emit(f"{v}_o = np.empty(({a}, {m}, {b}), np.{node.dtype.name})")
    em.emit(f"for q in range({m}):")
    em.emit(f"    k = {v}_i[q]")
    em.emit("    if k < 0:")
    em.emit(f"        k += {n}")
    em.emit(f"    if k < 0 or k >= {n}:")
    em.emit(f"        raise IndexError('take: index out of range for dim {dim} with size {n}')")
    em.emit(f"    for p in range({a}):")
    em.emit(f"        for r in range({b}):")
    em.emit(f"            {v}_o[p, q, r] = {v}_x[p, k, r]")
    em.emit(f"{v} = {v}_o.reshape({_tuple(_pad(node.shape))})")


def _scatter_add(em, node, src, idx):
    _static(em)
    v, dim, size = em.ctx.var(node), node.attrs["dim"], node.attrs["size"]
    s_node, i_node = node.inputs
    a = int(np.prod(s_node.shape[:dim])) if dim else 1
    m = int(np.prod(i_node.shape)) if len(i_node.shape) else 1
    b = int(np.prod(node.shape[dim + 1:])) if dim + 1 < len(node.shape) else 1
    em.emit(f"{v}_s = np.ascontiguousarray({src}).reshape(({a}, {m}, {b}))")
    em.emit(f"{v}_i = np.ascontiguousarray({idx}).reshape(({m},))")
    em.emit(f"{v}_o = np.zeros(({a}, {size}, {b}), np.{node.dtype.name})")
    em.emit(f"for q in range({m}):")
    em.emit(f"    k = {v}_i[q]")
    em.emit("    if k < 0:")
    em.emit(f"        k += {size}")
    em.emit(f"    for p in range({a}):")
    em.emit(f"        for r in range({b}):")
    em.emit(f"            {v}_o[p, k, r] += {v}_s[p, q, r]")
    em.emit(f"{v} = {v}_o.reshape({_tuple(_pad(node.shape))})")


def _argreduce(em, node, x):
    _static(em)
    v, dim = em.ctx.var(node), node.attrs["dim"]
    src = node.inputs[0]
    better = _BETTER[node.op]
    if dim is None or not len(src.shape):
        a, n, b = 1, int(np.prod(_pad(src.shape))), 1
    else:
        a, n, b = _three_way(src.shape, dim)
    em.emit(f"{v}_x = np.ascontiguousarray({x}).reshape(({a}, {n}, {b}))")
    em.emit(f"{v}_o = np.zeros(({a}, {b}), np.int64)")
    em.emit(f"for p in range({a}):")
    em.emit(f"    for r in range({b}):")
    em.emit(f"        {v}_m = {v}_x[p, 0, r]")
    em.emit(f"        for q in range(1, {n}):")
    em.emit(f"            {v}_c = {v}_x[p, q, r]")
    em.emit(f"            if {v}_m == {v}_m and ({v}_c {better} {v}_m or {v}_c != {v}_c):")
    em.emit(f"                {v}_m = {v}_c")
    em.emit(f"                {v}_o[p, r] = q")
    em.emit(f"{v} = {v}_o.reshape({_tuple(_pad(node.shape))})")


# (op, attr) pairs whose integers a split program's kernels take as arguments (see
# Context.slice_text), so unrolled steps that differ only there share one kernel.
PARAMETRIZED = frozenset({("slice", "index"), ("pad_slice", "index")})

# Rules whose result may be a view of their operand (everything else is a fresh array).
VIEW_RESULTS = frozenset({"reshape", "permute", "slice"})


def view_root(node, through=None):
    """The node whose buffer `node` views in generated code (itself when it owns its
    data); `through(n)`, when given, must hold for every view the walk passes."""
    while node.op in VIEW_RESULTS and node.inputs and (through is None or through(node)):
        node = node.inputs[0]
    return node

_BETTER = {"argmax": ">", "argmin": "<"}

# What the cost model, the split driver and the buffer planner know of a whole-node rule
# beyond its code (asked through the functions below, never by op name elsewhere):
# Numba compiles np.concatenate in time that grows with its operands (lines per operand);
# a concatenation of more arrays than DRIVER_ABOVE is run by the driver with NumPy; a
# 2-D matmul returns a fresh array (np.dot) the buffer planner may reuse.
_OPERAND_COST = {"cat": 8}
_DRIVER_ABOVE = {"cat": 8}
_FRESH_2D = frozenset({"matmul"})
_PRODUCTS = frozenset({"matmul"})  # rules that call BLAS (np.dot)


def operand_cost(node) -> int:
    """Extra compile cost of `node`'s rule, in code lines."""
    return _OPERAND_COST.get(node.op, 0) * len(node.inputs)


def run_by_driver(node) -> bool:
    """Is `node` better run with NumPy by a split kernel's driver?"""
    limit = _DRIVER_ABOVE.get(node.op)
    return limit is not None and len(node.inputs) > limit


# First line of a program that runs with BLAS's threads (part of its source, so of its
# kernel cache key: a kernel is shared only by programs making the same thread choice).
BLAS_THREADED = "# BLAS: its threads (most multiply-adds in products >= compiler.blas.LARGE_MACS)\n"


def large_product(graph) -> bool:
    """Should the graph's kernel run with BLAS's threads (`compiler.blas.kernel_is_large`)?
    A loop body's products count once per step (the trip count traced): beside a loop of
    many small products, one large product outside it is not most of the work."""
    return blas.kernel_is_large(_products(graph))


def any_large_product(graph) -> bool:
    """Does one of the graph's BLAS calls reach compiler.blas.LARGE_MACS (an llvm kernel
    then switches BLAS's threads around it, whatever `large_product` says)?"""
    return any(blas.macs(a, b) >= blas.LARGE_MACS for a, b in _products(graph))


def _products(graph) -> list:
    """(a_shape, b_shape) of each BLAS call the graph's kernel makes (a batched product
    with a 2-D right operand is one call over all its rows, `_matmul`)."""
    found = [_one_call(n.inputs[0].shape, n.inputs[1].shape) for n in graph.nodes
             if n.op in _PRODUCTS and n.dtype.kind == "f"]
    for n in graph.nodes:
        spec = n.attrs.get("spec") if is_loop(n) else None
        if spec is not None:
            found += _products(spec.body) * traced_trip(n)
    return found


def _one_call(a, b) -> tuple:
    if len(a) > 2 and len(b) == 2:
        return (int(np.prod(a[:-1])), a[-1]), tuple(b)
    return tuple(a), tuple(b)


def defined_by_producer(node) -> bool:
    """Is `node`'s variable defined by the rule of the node it reads (a loop's outputs),
    so no kernel boundary may separate them?"""
    return REGISTRY[node.op].infer_node is not None


def fresh_output(node) -> bool:
    """Does the rule leave `node`'s result in a new array of its own?"""
    return node.op in _FRESH_2D and len(node.shape) == 2


NODE_RULES = {
    "loop": emit_loop, "loop_out": emit_loop_out,
    "reshape": _reshape, "permute": _permute, "slice": _slice, "pad_slice": _pad_slice,
    "cat": _cat, "matmul": _matmul, "take": _take, "scatter_add": _scatter_add,
    "argmax": _argreduce, "argmin": _argreduce, "unfold": unfold, "fold": fold,
    "cumsum": cumsum, "argsort": argsort,
}


def emit_node(em, node):
    """Append the lines computing `node` (a NodeUnit) to the entry."""
    rule = NODE_RULES.get(node.op)
    if rule is None or is_reduction(node):
        raise LoweringError(f"the numba backend cannot lower op {node.op!r} on its own")
    em.emit(f"# {node.op} {node.type_str()}")
    rule(em, node, *[em.array_of(i) for i in node.inputs])
