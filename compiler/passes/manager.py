"""The pass manager: runs a declared list of passes to a fixed point, timing each.

In the spirit of Numba's `PassManager`: every pass run is timed and reported, the
IR can be printed after chosen passes (`HYBRIDNET_PRINT_AFTER=cse,dce` or `all`),
and in debug mode (`verify=True` or `HYBRIDNET_DEBUG=1`) the graph is verified
after every pass, so a broken pass is named at the point it broke the graph.
"""

import os
import sys
import time
from typing import Protocol

from ..errors import OpError
from ..ir import Graph
from .constfold import ConstantFolding
from .cse import CommonSubexpressionElimination
from .dce import DeadCodeElimination
from .simplify import AlgebraicSimplification

PRINT_AFTER_ENV = "HYBRIDNET_PRINT_AFTER"
DEBUG_ENV = "HYBRIDNET_DEBUG"


class Pass(Protocol):
    """What the manager runs: a `name` and `run(graph) -> (graph, changed)`.

    A pass may edit `graph` in place (the manager is always given a clone) and
    returns the graph to continue with. It must keep `graph.nodes` in a valid
    execution order, leave `graph.inputs` intact and keep each output's position.
    """

    name: str

    def run(self, graph: Graph) -> tuple:
        """Transform `graph`; return `(graph, changed)`."""
        ...


class PassVerifyError(OpError):
    """A pass left the graph invalid; the message names the pass and the problem."""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _parse_names(spec) -> frozenset:
    if spec is None:
        return frozenset()
    if isinstance(spec, str):
        spec = spec.split(",")
    return frozenset(s.strip() for s in spec if s.strip())


class PassManager:
    """Run `passes` in order, repeatedly, until none changes the graph (at most
    `max_rounds` rounds).

    >>> pm = PassManager(default_pipeline(), verify=True)       # doctest: +SKIP
    >>> graph, report = pm.run(g.clone())                       # doctest: +SKIP
    >>> [(r["name"], r["changed"]) for r in report]             # doctest: +SKIP

    `print_after` is a list (or comma-separated string) of pass names after which
    the IR is printed to stderr; 'all' prints after every pass. When it is None,
    `HYBRIDNET_PRINT_AFTER` is read at `run` time. `verify` (or `HYBRIDNET_DEBUG=1`)
    runs `graph.verify()` and the pass contract checks after every pass.
    """

    def __init__(self, passes, verify: bool = False, print_after=None, max_rounds: int = 10):
        self.passes = list(passes)
        self.verify = verify
        self.print_after = print_after
        self.max_rounds = max_rounds

    def run(self, graph: Graph) -> tuple:
        """Optimize `graph` in place (give it a clone); returns `(graph, report)`.

        `report` has one dict per pass run: name, changed, seconds, nodes_before,
        nodes_after.
        """
        verify = self.verify or _env_flag(DEBUG_ENV)
        spec = self.print_after if self.print_after is not None else os.environ.get(
            PRINT_AFTER_ENV)
        printed = _parse_names(spec)
        report = []
        for _ in range(self.max_rounds):
            any_changed = False
            for p in self.passes:
                graph, changed = self._run_one(p, graph, verify, printed, report)
                any_changed = any_changed or changed
            if not any_changed:
                break
        return graph, report

    def _run_one(self, p, graph, verify, printed, report) -> tuple:
        inputs, out_types = list(graph.inputs), [o.type_str() for o in graph.outputs]
        before = len(graph.nodes)
        start = time.perf_counter()
        graph, changed = p.run(graph)
        seconds = time.perf_counter() - start
        report.append({"name": p.name, "changed": bool(changed), "seconds": seconds,
                       "nodes_before": before, "nodes_after": len(graph.nodes)})
        if verify:
            try:
                _check_contract(graph, inputs, out_types)
                graph.verify()
            except OpError as err:
                raise PassVerifyError(f"pass {p.name!r} broke the graph: {err}") from err
        if "all" in printed or p.name in printed:
            print(f"=== after {p.name} ===", file=sys.stderr)
            print(graph, file=sys.stderr)
        return graph, changed


def _check_contract(graph, inputs, out_types) -> None:
    """What `verify()` cannot see: the pass kept inputs, output positions and types."""
    if len(graph.inputs) != len(inputs) or any(a is not b for a, b in zip(graph.inputs, inputs)):
        raise OpError("the graph inputs changed (passes must keep every input, in order)")
    now = [o.type_str() for o in graph.outputs]
    if now != out_types:
        raise OpError(f"the outputs changed from {out_types} to {now}")
    if len({id(n) for n in graph.nodes}) != len(graph.nodes):
        raise OpError("a node appears twice in graph.nodes")


def default_pipeline() -> list:
    """Fresh instances of the standard passes, in order: constfold, simplify, cse, dce."""
    return [ConstantFolding(), AlgebraicSimplification(), CommonSubexpressionElimination(),
            DeadCodeElimination()]


def optimize(graph: Graph, passes=None, verify: bool = False) -> tuple:
    """Optimize a clone of `graph` (the original is untouched); returns `(graph, report)`.

    `passes` defaults to `default_pipeline()`; see `PassManager` for the report.
    """
    manager = PassManager(default_pipeline() if passes is None else passes, verify=verify)
    return manager.run(graph.clone())
