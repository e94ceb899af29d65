"""Forward and backward of a traced call, optimized together and split (`split_gradient`):
the gradient graph (`loop_grad.loop_joint` when the forward's loops can be
differentiated as loops, else `autodiff.grad_graph` of the unrolled graph), rerolled and
optimized, then split by `partition`."""

import os
import time

from .autodiff import grad_graph
from .ir import Graph
from .loop_grad import loop_joint
from .partition import partition
from .passes.manager import optimize
from .reroll import reroll


def split_gradient(graph: Graph, wrt, seeded=None, blocked=frozenset(),
                   picks=True) -> tuple:
    """Forward and backward of `graph` with respect to the nodes `wrt` (seeding the
    outputs at positions `seeded`, default all), optimized together (constant folding,
    simplification and CSE see both; dead values go), then split: returns
    `(Split, pass report)`. Loops are rerolled before differentiating where their
    backward can be a loop (compiler.loop_grad), else the unrolled graph is
    differentiated and rerolled after; the report's "loop_grad" entry says which.
    `picks` False: not for loops with picked steps, whose gradients then write a window
    that moves with the length (numba's size-generic code takes none).
    HYBRIDNET_LOOP_GRAD=0: never; =strict: an error making the loops' gradients raises
    instead of falling back (the tests run so)."""
    start, mode = time.perf_counter(), os.environ.get("HYBRIDNET_LOOP_GRAD", "")
    joint, note = None, "off (HYBRIDNET_LOOP_GRAD=0)"
    if mode != "0":
        try:
            joint = loop_joint(graph, wrt, seeded, blocked, picks)
            note = "no loop whose gradient is a loop" if joint is None else None
        except Exception as exc:  # noqa: BLE001  (the unrolled graph's gradient is right)
            if mode == "strict":
                raise
            note = f"fell back: {type(exc).__name__}: {exc}"
    entry = {"name": "loop_grad", "changed": joint is not None, "note": note,
             "seconds": time.perf_counter() - start, "nodes_before": len(graph.nodes)}
    if joint is None:
        joint = grad_graph(graph, wrt, seeded, blocked)
    entry["nodes_after"] = len(joint.nodes)
    optimized, report = optimize(reroll(joint)[0])
    n_seeds = len(graph.outputs) if seeded is None else len(seeded)
    recompute = os.environ.get("HYBRIDNET_RECOMPUTE") == "1"
    return partition(optimized, len(graph.outputs), n_seeds, recompute), [entry] + report
