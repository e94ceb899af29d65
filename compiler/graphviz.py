"""Graph conversions for viewing: networkx and Graphviz DOT."""


def _label(graph, node, names) -> str:
    attrs = ", ".join(f"{k}={v}" for k, v in node.attrs.items())
    extra = f"\\n{attrs}" if attrs else ""
    return f"{names[id(node)]} {node.op}{extra}\\n{node.type_str()}".replace('"', "'")


def to_networkx(graph):
    """A `networkx.DiGraph` with vertices named like the printer ('%3')."""
    import networkx as nx

    names = graph.names()
    g = nx.DiGraph()
    outputs = {id(o) for o in graph.outputs}
    for node in graph.nodes:
        g.add_node(names[id(node)], op=node.op, shape=tuple(node.shape), dtype=str(node.dtype),
                   attrs=dict(node.attrs), output=id(node) in outputs)
    for node in graph.nodes:
        for pos, inp in enumerate(node.inputs):
            g.add_edge(names[id(inp)], names[id(node)], index=pos)
    return g


def to_dot(graph) -> str:
    """Graphviz source: inputs as ellipses, ops as boxes, outputs double-bordered."""
    names = graph.names()
    outputs = {id(o) for o in graph.outputs}
    lines = ["digraph hybridnet {", "  rankdir=TB;", '  node [fontname="monospace"];']
    for node in graph.nodes:
        shape = "ellipse" if node.is_source else "box"
        periph = ", peripheries=2" if id(node) in outputs else ""
        key = names[id(node)].lstrip("%")
        lines.append(f'  n{key} [label="{_label(graph, node, names)}", shape={shape}{periph}];')
    for node in graph.nodes:
        for inp in node.inputs:
            lines.append(f"  n{names[id(inp)].lstrip('%')} -> n{names[id(node)].lstrip('%')};")
    lines.append("}")
    return "\n".join(lines) + "\n"
