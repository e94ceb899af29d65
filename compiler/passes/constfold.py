"""Constant folding: evaluate pure ops on constants with the registry's own `impl`.

There is one arithmetic: folding runs exactly the NumPy code the interpreter runs,
so a folded graph computes what the unfolded one did.
"""

import math

import numpy as np

from ..ir import Graph, Node
from ..registry import REGISTRY, Trait
from .rewrite import rewrite_graph

MAX_FOLD_ELEMENTS = 4096  # bigger results stay computed at run time (keeps graphs small)


def const_value(node: Node) -> np.ndarray:
    """The array a 'const' node produces."""
    return REGISTRY["const"].impl(**node.attrs)


def make_const(array: np.ndarray, requires_grad: bool = False) -> Node:
    """A 'const' node holding `array` (0-d as a Python scalar, else a private copy)."""
    array = np.asarray(array)
    value = array.item() if array.ndim == 0 else np.array(array, copy=True)
    return Node("const", (), {"value": value, "dtype": str(array.dtype)}, tuple(array.shape),
                array.dtype, requires_grad)


def _broadcast_scalar(node: Node) -> bool:
    """A constant scalar broadcast (the form uniform results fold to)."""
    return REGISTRY[node.op].has(Trait.BROADCAST) and node.inputs[0].op == "const" and \
        not node.inputs[0].shape and node.inputs[0].dtype == node.dtype


def _value(node: Node) -> np.ndarray:
    if node.op == "const":
        return const_value(node)
    return np.broadcast_to(const_value(node.inputs[0]), node.shape)


def _foldable(node: Node) -> bool:
    opdef = REGISTRY[node.op]
    return (opdef.has(Trait.PURE) and not opdef.has(Trait.SOURCE)
            and not _broadcast_scalar(node)
            and all(i.op == "const" or _broadcast_scalar(i) for i in node.inputs)
            and math.prod(node.shape) <= MAX_FOLD_ELEMENTS)


def fold(node: Node) -> Node | None:
    """`node` evaluated into a new 'const' node, or None when it cannot be folded.

    Ops that raise on these constants (an out-of-range `take`, say) are left for
    run time, where the error is reported as usual.
    """
    if not _foldable(node):
        return None
    args = [_value(i) for i in node.inputs]
    try:
        with np.errstate(all="ignore"):
            result = np.asarray(REGISTRY[node.op].impl(*args, **node.attrs))
    except Exception:  # noqa: BLE001 - whatever failed here will fail (and be reported) at run time
        return None
    if tuple(result.shape) != tuple(node.shape) or result.dtype != node.dtype:
        return None  # impl and shape rule disagree: not ours to paper over
    if result.size > 1 and _uniform(result) and all(_uniform_input(i) for i in node.inputs):
        return _broadcast(result, node.requires_grad)
    return make_const(result, node.requires_grad)


def _uniform(array) -> bool:
    """Every element the same value (the same bits: -0.0 is not 0.0; NaNs alike)."""
    if array.dtype.kind in "OSUV" or not array.size:
        return False
    flat = np.ascontiguousarray(array).reshape(-1)
    bits = flat.view(np.uint8).reshape(flat.size, flat.itemsize)
    return bool((bits == bits[0]).all())


def _uniform_input(node: Node) -> bool:
    """A one-element constant or one broadcast: a uniform result of such inputs is uniform
    at every size. (An array may be uniform by chance: arange(n) < 8 while n <= 8, so
    what is folded from arrays stays an array.)"""
    return math.prod(node.shape) == 1 or _broadcast_scalar(node)


def _broadcast(array, requires_grad) -> Node:
    """A uniform array as its one value broadcast (the gradient seed of `x.sum() * c` over
    a sequence: no array whose size follows a length, which generalizing could not
    compute from the length, and no bytes in the kernel)."""
    scalar = make_const(array.reshape(-1)[0])
    return Node("expand", (scalar,), {"shape": tuple(array.shape)}, tuple(array.shape),
                array.dtype, requires_grad)


class ConstantFolding:
    """Replace each non-source PURE op whose inputs are all 'const' (or a 'const' scalar
    broadcast) by a 'const'; a uniform result of one-element or broadcast constants by
    its one value broadcast (`expand` of a 0-d 'const').

    Results with more than `MAX_FOLD_ELEMENTS` elements are not folded. Inputs that
    become unused are left for dead code elimination.

    >>> graph, changed = ConstantFolding().run(g)   # doctest: +SKIP
    """

    name = "constfold"

    def run(self, graph: Graph) -> tuple:
        """Fold in place, in one walk (folds cascade forward); returns `(graph, changed)`."""
        return rewrite_graph(graph, fold)
