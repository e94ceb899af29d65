"""Graph conversions for viewing: networkx and Graphviz DOT (fusion groups as clusters)."""


def _label(graph, node, names) -> str:
    attrs = ", ".join(f"{k}={_short(v)}" for k, v in node.attrs.items())
    parts = [f"{names[id(node)]} {node.op}"] + ([attrs] if attrs else []) + [node.type_str()]
    return "\\n".join(p.replace("\\", "\\\\").replace('"', "'") for p in parts)


def _short(value) -> str:
    text = repr(value) if not hasattr(value, "shape") or value.size <= 4 else \
        f"array({value.dtype}{list(value.shape)})"
    return text if len(text) <= 60 else text[:57] + "..."


def to_networkx(graph, groups=None):
    """A `networkx.DiGraph` with vertices named like the printer ('%3'); vertex attributes
    op, shape, dtype, attrs, output and fusion_group (the kernel index from `groups`,
    id(node) -> index, or None)."""
    import networkx as nx

    names = graph.names()
    groups = groups or {}
    g = nx.DiGraph()
    outputs = {id(o) for o in graph.outputs}
    for node in graph.nodes:
        g.add_node(names[id(node)], op=node.op, shape=tuple(node.shape), dtype=str(node.dtype),
                   attrs=dict(node.attrs), output=id(node) in outputs,
                   fusion_group=groups.get(id(node)))
    for node in graph.nodes:
        for pos, inp in enumerate(node.inputs):
            g.add_edge(names[id(inp)], names[id(node)], index=pos)
    return g


def to_dot(graph, groups=None) -> str:
    """Graphviz source: inputs as ellipses, ops as boxes, outputs double-bordered; the
    nodes of one fused kernel (`groups`: id(node) -> kernel index) in one cluster."""
    names = graph.names()
    outputs = {id(o) for o in graph.outputs}
    groups = groups or {}
    lines = ["digraph hybridnet {", "  rankdir=TB;", '  node [fontname="monospace"];']
    clusters = {}
    for node in graph.nodes:
        shape = "ellipse" if node.is_source else "box"
        periph = ", peripheries=2" if id(node) in outputs else ""
        key = names[id(node)].lstrip("%")
        line = f'n{key} [label="{_label(graph, node, names)}", shape={shape}{periph}];'
        if id(node) in groups:
            clusters.setdefault(groups[id(node)], []).append(line)
        else:
            lines.append("  " + line)
    for index in sorted(clusters):
        lines.append(f"  subgraph cluster_kernel{index} {{")
        lines.append(f'    label="kernel {index}"; style=rounded; color=blue;')
        lines.extend("    " + line for line in clusters[index])
        lines.append("  }")
    for node in graph.nodes:
        for inp in node.inputs:
            lines.append(f"  n{names[id(inp)].lstrip('%')} -> n{names[id(node)].lstrip('%')};")
    lines.append("}")
    return "\n".join(lines) + "\n"
