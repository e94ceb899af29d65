"""Lower an optimized graph to the Python source of one Numba entry function.

The entry takes the graph inputs (0-d arrays are passed as 1-element 1-d arrays)
and returns a tuple of output arrays. Each fused `LoopGroup` becomes one loop
nest written inline, each `NodeUnit` a few NumPy calls Numba supports, so a
traced call crosses into machine code once. Loop bounds come from the input
arrays at run time; where a size cannot (a reshape to a fixed shape, say), the
program is marked `shape_generic=False` and is reused only for exact shapes.

A program longer than the kernel budget (`KERNEL_BUDGET` emitted lines,
`HYBRIDNET_KERNEL_BUDGET`) is split into bounded kernels called in order by a
plain-Python driver (`compiler.lowering.split`): Numba's compile time grows much
faster than linearly with the size of one function.
"""

import os

from ..errors import LoweringError
from ..loop import is_loop
from ..passes.fusion import LoopGroup, NodeUnit, partition
from ..registry import lowering_refusal
from . import node_rules
from .buffers import BufferPlanner
from .emit import (
    PARALLEL_THRESHOLD,
    Context,
    Program,
    _Emitter,
    code_lines,
    emit_unit,
    unit_cost,
)
from .node_rules import BLAS_THREADED
from .rules import RULES, is_reduction, reduce_identity
from .split import lower_split

# Emitted lines (comments aside) one Numba function may hold; longer programs are split.
# (Numba's compile time per line starts growing at about this size.)
KERNEL_BUDGET = 256
# Lines of *distinct* kernel source beyond which a graph is not compiled (it runs eagerly):
# at the ~40-60 lines a second Numba compiles, a couple of minutes.
KERNEL_CAP = 6000
# Fused units beyond which a graph is not even lowered (it runs eagerly).
MAX_UNITS = 100_000


def _env_int(name, default) -> int:
    try:
        return int(os.environ.get(name, "")) if os.environ.get(name) else default
    except ValueError:
        return default


def kernel_budget() -> int:
    """The per-kernel line budget: HYBRIDNET_KERNEL_BUDGET, else KERNEL_BUDGET."""
    return max(1, _env_int("HYBRIDNET_KERNEL_BUDGET", KERNEL_BUDGET))


def kernel_cap() -> int:
    """The compile cap in distinct kernel lines: HYBRIDNET_KERNEL_CAP, else KERNEL_CAP."""
    return max(1, _env_int("HYBRIDNET_KERNEL_CAP", KERNEL_CAP))


def lower(graph, mathlib=None, parallel=False, budget=None) -> Program:
    """Generate the Numba entry for `graph` (an optimized clone).

    parallel=True lets loop nests over at least PARALLEL_THRESHOLD elements split their
    outermost loop across threads (numba.prange). A program of more than `budget` lines
    (default `kernel_budget()`) is split into kernels and a driver (`split.lower_split`);
    one whose distinct kernels exceed `kernel_cap()` lines raises LoweringError."""
    units = partition(graph)
    if len(units) > MAX_UNITS:
        raise LoweringError(f"graph too large to compile: {len(units)} fused units (more than "
                            f"{MAX_UNITS}); it runs eagerly")
    program, costs = _lower_single(graph, units, mathlib, parallel)
    budget = kernel_budget() if budget is None else budget
    if program.cost > budget:
        program = lower_split(graph, units, costs, mathlib, parallel, budget,
                              _lower_bodies(graph, mathlib)) or program
    check_cap(program)
    return program


def check_cap(program) -> None:
    """Raise LoweringError when the program's distinct kernels are too long to compile."""
    cap = kernel_cap()
    if program.cost > cap:
        kernels = max(1, len(program.chunks))
        raise LoweringError(
            f"graph too large to compile: {program.cost} lines of distinct kernel code in "
            f"{kernels} kernel(s) exceed the cap of {cap} (HYBRIDNET_KERNEL_CAP); "
            f"{len(program.units)} fused units run eagerly instead")


_BODIES = {}  # LoopSpec key -> (body Program, which body outputs may alias an input)
_UNBOUNDED = 1 << 30  # a loop body is one function (it is called from machine code)


def _lower_bodies(graph, mathlib) -> dict:
    """The lowered body of each loop node (memoized by the loop's structure): a Program
    the loop's entry calls, and which body outputs may be an input's array or a view of
    one (copied when they leave the loop)."""
    found = {}
    for node in graph.nodes:
        spec = node.attrs.get("spec") if is_loop(node) else None
        if spec is None or spec.key in found:
            continue
        body = _BODIES.get(spec.key)
        if body is None:
            check_supported(spec.body)
            program = lower(spec.body, mathlib, parallel=False, budget=_UNBOUNDED)
            aliased = [node_rules.view_root(o).op == "input" for o in spec.body.outputs]
            body = _BODIES[spec.key] = (program, aliased)
        found[spec.key] = body
    return found


def _lower_single(graph, units, mathlib, parallel):
    """The one-entry program plus each unit's cost in code lines."""
    ctx = Context(graph, mathlib, parallel)
    ctx.bodies = _lower_bodies(graph, mathlib)
    em = _Emitter(graph, ctx)
    units_of = {}
    for unit in units:
        for node in unit.nodes:
            units_of[id(node)] = unit
    em.planner = BufferPlanner(graph, units_of)
    args = ", ".join(ctx.var(n) for n in graph.inputs)
    em.lines.append(f"def entry({args}):")
    costs = []
    for unit in units:
        start = len(em.lines)
        emit_unit(em, unit, units_of)
        costs.append(unit_cost(unit, em.lines[start:]))
    outs = [em.array_of(o) for o in graph.outputs]
    if len(outs) == 1:  # a bare array: Numba boxes it faster than a 1-tuple
        em.emit(f"return {outs[0]}")
    else:
        em.emit(f"return ({', '.join(outs)}{',' if outs else ''})")
    large = ctx.uses_blas and node_rules.large_product(graph)
    source = (BLAS_THREADED if large else "") + "\n".join(em.lines) + "\n"
    program = Program(source, "entry", ctx.globals, units, ctx.shape_generic, ctx.uses_blas)
    program.single_output = len(outs) == 1
    program.parallel = ctx.uses_prange
    program.large_products = large
    program.may_exit = ctx.may_exit
    program.cost = sum(costs) + 2
    program.notes.append(f"buffers reused: {em.planner.reused}")
    return program, costs


def check_supported(graph) -> None:
    """Raise LoweringError naming the first op with no lowering rule."""
    for node in graph.nodes:
        if node.is_source:
            continue
        if node.op not in RULES and node.op not in node_rules.NODE_RULES and \
                not is_reduction(node):
            raise LoweringError(f"the numba backend cannot lower op {node.op!r} yet")
        if any(d == 0 for d in node.shape):
            raise LoweringError(f"{node.op}: size-0 dims are run eagerly ({node.type_str()})")
        why = lowering_refusal(node)
        if why:
            raise LoweringError(why)


__all__ = ["LoopGroup", "NodeUnit", "Program", "LoweringError", "lower", "check_supported",
           "Context", "code_lines", "emit_unit", "PARALLEL_THRESHOLD",
           "reduce_identity", "is_reduction", "kernel_budget", "kernel_cap", "KERNEL_BUDGET",
           "KERNEL_CAP"]
