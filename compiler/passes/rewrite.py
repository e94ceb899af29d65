"""One rewrite loop for the passes that replace nodes (in the spirit of FX's
`replace_all_uses_with`): a pass is a rule `node -> replacement or None`.

`rewrite_graph(graph, rule)` walks the nodes in execution order. When the rule returns
a node, every later user of the old node and every graph output use the replacement
instead: an earlier node (the old one is dropped, as CSE and operand-returning
simplifications want) or a new node, which takes the old one's place in the order
(constant folding, rebuilt permutes). With `repeat=True` the rule is applied again to
a new replacement until it settles.
"""

from ..ir import Graph, Node


def rewrite_graph(graph: Graph, rule, repeat: bool = False) -> tuple:
    """Apply `rule` to every node in place; returns `(graph, changed)`."""
    replaced, kept, defined = {}, [], set()
    originals = {id(n) for n in graph.nodes}
    for node in graph.nodes:
        if replaced:
            node.inputs = tuple(replaced.get(id(i), i) for i in node.inputs)
        current = _settle(node, rule, repeat, defined)
        if id(current) not in defined:
            _place_new_inputs(current, rule, repeat, kept, defined, originals)
            kept.append(current)
            defined.add(id(current))
        if current is not node:
            replaced[id(node)] = current
    if replaced:
        graph.nodes = kept
        graph.outputs = [replaced.get(id(o), o) for o in graph.outputs]
    return graph, bool(replaced)


def _place_new_inputs(node, rule, repeat, kept, defined, originals):
    """A replacement may bring new nodes of its own as inputs (b' and a' of b' @ a'):
    each is simplified in turn and placed before it."""
    inputs = []
    for i in node.inputs:
        if id(i) not in defined and id(i) not in originals:
            _place_new_inputs(i, rule, repeat, kept, defined, originals)
            i = _settle(i, rule, repeat, defined)
            if id(i) not in defined:
                _place_new_inputs(i, rule, repeat, kept, defined, originals)
                kept.append(i)
                defined.add(id(i))
        inputs.append(i)
    node.inputs = tuple(inputs)


def _settle(node: Node, rule, repeat: bool, defined: set) -> Node:
    """What `node` becomes: stop at a node defined earlier, or when the rule says None."""
    current = node
    while id(current) not in defined:
        new = rule(current)
        if new is None or new is current:
            break
        current = new
        if not repeat:
            break
    return current
