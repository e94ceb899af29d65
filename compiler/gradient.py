"""Forward and backward of a traced call, optimized together and split (`split_gradient`):
the gradient graph (`autodiff.grad_graph`, or `loop_grad.loop_joint` when the forward's
loops can be differentiated as loops), rerolled and optimized, then split by
`partition`."""

import os

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
    backward can be a loop (compiler.loop_grad; HYBRIDNET_LOOP_GRAD=0: never), else the
    unrolled graph is differentiated and rerolled after. `picks` False: not for loops
    with picked steps, whose gradients then write a window that moves with the length
    (numba's size-generic code takes none)."""
    joint = None if os.environ.get("HYBRIDNET_LOOP_GRAD") == "0" else \
        loop_joint(graph, wrt, seeded, blocked, picks)
    if joint is None:  # (no loop whose gradient is a loop: the unrolled graph's)
        joint = grad_graph(graph, wrt, seeded, blocked)
    optimized, report = optimize(reroll(joint)[0])
    n_seeds = len(graph.outputs) if seeded is None else len(seeded)
    recompute = os.environ.get("HYBRIDNET_RECOMPUTE") == "1"
    return partition(optimized, len(graph.outputs), n_seeds, recompute), report
