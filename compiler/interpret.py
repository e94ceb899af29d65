"""The reference interpreter: runs any Graph with the registry's NumPy impls.

It is the oracle compiled code is checked against, and the fallback engine for
exported graphs.
"""

import numpy as np

from .errors import OpError, describe
from .registry import REGISTRY


def run_node(node, args):
    """Evaluate one node on NumPy arrays."""
    return REGISTRY[node.op].impl(*args, **node.attrs)


def _bind_inputs(graph, arrays) -> dict:
    if len(arrays) != len(graph.inputs):
        raise OpError(f"Graph.run: expected {len(graph.inputs)} input arrays "
                      f"({', '.join(n.type_str() for n in graph.inputs)}), got {len(arrays)}")
    env = {}
    for i, (node, arr) in enumerate(zip(graph.inputs, arrays)):
        arr = np.asarray(arr)
        if tuple(arr.shape) != tuple(node.shape):
            raise OpError(f"Graph.run: input {i} should be {node.type_str()}, "
                          f"got {arr.dtype}{list(arr.shape)}")
        if arr.dtype != node.dtype:
            if not np.can_cast(arr.dtype, node.dtype, "same_kind"):
                raise OpError(f"Graph.run: input {i} should be {node.type_str()}, "
                              f"got {arr.dtype}{list(arr.shape)}")
            arr = arr.astype(node.dtype)
        env[id(node)] = arr
    return env


def run(graph, *arrays) -> list:
    """Execute `graph` on `arrays` (one per graph input); returns the output arrays.

    A node that fails raises OpError naming the node (as the printer shows it), its op
    and the shapes and dtypes of the arrays it was given, in the spirit of FX's
    "While executing %n".
    """
    env = _bind_inputs(graph, arrays)
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            if id(node) not in env:
                args = [env[id(i)] for i in node.inputs]
                try:
                    env[id(node)] = run_node(node, args)
                except Exception as exc:  # noqa: BLE001  (re-raised with the node named)
                    raise _node_error(graph, node, args, exc) from exc
    return [env[id(o)] for o in graph.outputs]


def _node_error(graph, node, args, exc) -> OpError:
    shapes = [np.shape(a) for a in args]
    dtypes = [np.result_type(a) for a in args]
    return OpError(f"Graph.run: while executing {graph.node_line(node)}: op {node.op!r} "
                   f"failed on inputs ({describe(shapes, dtypes)}): "
                   f"{type(exc).__name__}: {exc}")
