"""Common subexpression elimination: one node per distinct pure computation."""

import math

import numpy as np

from ..ir import Graph, Node
from ..registry import REGISTRY, Trait
from .rewrite import rewrite_graph


def attr_key(value) -> object:
    """A hashable key that is equal exactly when two attribute values are equal.

    Arrays compare by dtype, shape and bytes; numbers by value (1, 1.0 and True
    match) except that -0.0 stays apart from 0.0, since 1/x tells them apart.
    """
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        negative_zero = value == 0 and math.copysign(1.0, value) < 0
        if value.is_integer() and not negative_zero:
            return ("int", int(value))
        return ("float", value.hex())
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return ("int", int(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(attr_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, attr_key(v)) for k, v in value.items())))
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return value


def const_key(node: Node) -> tuple:
    """Key of a 'const' node: the exact array it produces (dtype, shape, bytes)."""
    arr = REGISTRY["const"].impl(**node.attrs)
    return ("const", arr.dtype.str, arr.shape, arr.tobytes())


def attrs_key(node: Node) -> tuple:
    """Key of a node's attributes: equal exactly when they are (see attr_key)."""
    return tuple(sorted((k, attr_key(v)) for k, v in node.attrs.items()))


def node_key(node: Node, attrs_of=attrs_key) -> tuple:
    """Key under which two pure nodes compute the same value (`attrs_of(node)`: its
    attributes' key, which a caller may have cached)."""
    if node.op == "const":
        return const_key(node)
    ids = [id(i) for i in node.inputs]
    if REGISTRY[node.op].has(Trait.COMMUTATIVE):
        ids.sort()
    attrs = attrs_of(node)
    return (node.op, tuple(ids), attrs, tuple(node.shape), node.dtype.str)


class CommonSubexpressionElimination:
    """Merge nodes of PURE ops with the same op, inputs and attrs.

    Inputs are compared by identity (in any order for COMMUTATIVE ops); 'const'
    nodes merge when they hold the same value and dtype. The first occurrence is
    kept, so the execution order stays valid. Graph inputs are never merged.

    >>> graph, changed = CommonSubexpressionElimination().run(g)   # doctest: +SKIP
    """

    name = "cse"

    def run(self, graph: Graph) -> tuple:
        """Merge duplicates in place; returns `(graph, changed)`."""
        seen = {}

        def first_of(node):
            if not REGISTRY[node.op].has(Trait.PURE):
                return None
            first = seen.setdefault(node_key(node), node)
            if first is node:
                return None
            first.requires_grad = first.requires_grad or node.requires_grad
            return first
        return rewrite_graph(graph, first_of)
