"""Dead code elimination: drop the nodes that no output depends on."""

from ..ir import Graph
from ..registry import REGISTRY, Trait


class DeadCodeElimination:
    """Keep only the ancestors of the outputs (and every graph input, used or not).

    Nodes of ops that are neither PURE nor SOURCE count as side effects and are
    kept with their ancestors (no current primitive is one, but the rule is
    trait-driven so a future one is safe).

    >>> graph, changed = DeadCodeElimination().run(g)   # doctest: +SKIP
    """

    name = "dce"

    def run(self, graph: Graph) -> tuple:
        """Remove dead nodes in place; returns `(graph, changed)`."""
        roots = list(graph.outputs) + list(graph.inputs)
        roots += [n for n in graph.nodes if _has_effects(n)]
        live, stack = set(), roots
        while stack:
            node = stack.pop()
            if id(node) not in live:
                live.add(id(node))
                stack.extend(node.inputs)
        kept = [n for n in graph.nodes if id(n) in live]
        changed = len(kept) != len(graph.nodes)
        graph.nodes = kept
        return graph, changed


def _has_effects(node) -> bool:
    traits = REGISTRY[node.op].traits
    return Trait.PURE not in traits and Trait.SOURCE not in traits
