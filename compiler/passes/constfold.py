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


def _foldable(node: Node) -> bool:
    opdef = REGISTRY[node.op]
    return (opdef.has(Trait.PURE) and not opdef.has(Trait.SOURCE)
            and all(i.op == "const" for i in node.inputs)
            and math.prod(node.shape) <= MAX_FOLD_ELEMENTS)


def fold(node: Node) -> Node | None:
    """`node` evaluated into a new 'const' node, or None when it cannot be folded.

    Ops that raise on these constants (an out-of-range `take`, say) are left for
    run time, where the error is reported as usual.
    """
    if not _foldable(node):
        return None
    args = [const_value(i) for i in node.inputs]
    try:
        with np.errstate(all="ignore"):
            result = np.asarray(REGISTRY[node.op].impl(*args, **node.attrs))
    except Exception:  # noqa: BLE001 - whatever failed here will fail (and be reported) at run time
        return None
    if tuple(result.shape) != tuple(node.shape) or result.dtype != node.dtype:
        return None  # impl and shape rule disagree: not ours to paper over
    return make_const(result, node.requires_grad)


class ConstantFolding:
    """Replace each non-source PURE op whose inputs are all 'const' by a 'const'.

    Results with more than `MAX_FOLD_ELEMENTS` elements are not folded. Inputs that
    become unused are left for dead code elimination.

    >>> graph, changed = ConstantFolding().run(g)   # doctest: +SKIP
    """

    name = "constfold"

    def run(self, graph: Graph) -> tuple:
        """Fold in place, in one walk (folds cascade forward); returns `(graph, changed)`."""
        return rewrite_graph(graph, fold)
