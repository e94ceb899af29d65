"""Graph optimization passes and the pass manager that runs them.

A pass is an object with a `name` and `run(graph) -> (graph, changed)`; it may
edit the graph in place, so passes always run on a clone. The default pipeline
is a declared list, run to a fixed point by `PassManager`:

>>> graph, report = optimize(recorded_graph)          # doctest: +SKIP
>>> [(r["name"], r["changed"], r["nodes_after"]) for r in report]  # doctest: +SKIP

Set `HYBRIDNET_PRINT_AFTER=constfold,cse` (or `all`) to print the IR after those
passes, and `HYBRIDNET_DEBUG=1` to verify the graph after every pass.
"""

from .. import ops  # noqa: F401  (fills the op registry the passes query)
from .constfold import ConstantFolding
from .cse import CommonSubexpressionElimination
from .dce import DeadCodeElimination
from .manager import Pass, PassManager, PassVerifyError, default_pipeline, optimize
from .simplify import AlgebraicSimplification

__all__ = [
    "AlgebraicSimplification", "CommonSubexpressionElimination", "ConstantFolding",
    "DeadCodeElimination", "Pass", "PassManager", "PassVerifyError", "default_pipeline",
    "optimize",
]
