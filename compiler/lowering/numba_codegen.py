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
from dataclasses import dataclass, field

import numpy as np

from ..errors import OpError
from ..ir import pad_shape as _pad
from ..passes.fusion import LoopGroup, NodeUnit, partition
from . import node_rules
from .buffers import BufferPlanner
from .rules import RULES, is_reduction, libm_name, reduce_identity

# Loop nests with at least this many iterations run their outer loop in parallel.
PARALLEL_THRESHOLD = 1 << 20

# Emitted lines (comments aside) one Numba function may hold; longer programs are split.
# (Numba's compile time per line starts growing at about this size.)
KERNEL_BUDGET = 256
# Lines of *distinct* kernel source beyond which a graph is not compiled (it runs eagerly):
# at the ~40-60 lines a second Numba compiles, a couple of minutes.
KERNEL_CAP = 6000
# Fused units beyond which a graph is not even lowered (it runs eagerly).
MAX_UNITS = 100_000
# Numba compiles np.concatenate in time that grows with its operands: so many lines each.
CAT_OPERAND_COST = 8


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


class LoweringError(OpError):
    """The graph uses something this backend cannot lower (the caller falls back)."""


@dataclass
class Program:
    """Generated source plus what the runtime needs to call it."""

    source: str
    entry: str
    globals: dict
    units: list
    shape_generic: bool
    uses_blas: bool = False
    notes: list = field(default_factory=list)
    single_output: bool = False  # the entry returns one array, not a tuple
    parallel: bool = False  # uses numba.prange (compile with parallel=True)
    # A split program: its distinct kernels (`split.Chunk`) and the plain-Python driver
    # source (`entry`, calling them as c0, c1, ...; `globals` are the driver's).
    chunks: list = field(default_factory=list)
    driver: str = ""
    cost: int = 0  # emitted lines (comments aside) Numba compiles


class Context:
    """Naming, typed constants and math-function choice during codegen."""

    def __init__(self, graph, mathlib=None, parallel=False, index=None):
        self.graph = graph
        self.parallel = parallel
        self.parallel_threshold = PARALLEL_THRESHOLD
        self.uses_prange = False
        self.index = {id(n): i for i, n in enumerate(graph.nodes)} if index is None else index
        self.globals = {"np": np}
        self.mathlib = mathlib or {}
        self.shape_generic = True
        self.uses_blas = False
        self._consts = {}

    def var(self, node) -> str:
        return f"v{self.index[id(node)]}"

    def scalar(self, node) -> str:
        return f"s{self.index[id(node)]}"

    def const(self, value, dtype) -> str:
        dtype = np.dtype(dtype)
        key = (dtype.str, repr(dtype.type(value).item()))
        name = self._consts.get(key)
        if name is None:
            name = f"K{len(self._consts)}"
            self._consts[key] = name
            self.globals[name] = dtype.type(value)
        return name

    def array_const(self, node) -> str:
        name = f"A{self.index[id(node)]}"
        value = np.asarray(node.attrs["value"], dtype=node.dtype)
        self.globals[name] = np.ascontiguousarray(value.reshape(_pad(value.shape)))
        return name

    def group_id(self, group) -> int:
        """The number naming a loop group's size variables (d<id>_<dim>)."""
        return group.index

    def slice_text(self, index) -> str:
        """The subscript for a static slice index ((start, stop, step) per dim)."""
        return ", ".join(f"{a}:{b}:{c}" for a, b, c in index) or ":"

    def math(self, name, dtype, optional=False):
        fast = self.mathlib.get(f"{name}_{np.dtype(dtype).name[:1]}{np.dtype(dtype).itemsize * 8}")
        if fast is not None:
            alias = f"{name}_fast"
            self.globals[alias] = fast
            return alias
        if optional:
            return None
        if name == "erf":
            import math
            self.globals["math"] = math
        return libm_name(name)


class _Emitter:
    def __init__(self, graph, ctx, users=None, outputs=None):
        self.graph, self.ctx = graph, ctx
        self.lines = []
        self.users = graph.users() if users is None else users
        self.outputs = {id(o) for o in graph.outputs} if outputs is None else outputs
        self.planner = None

    def emit(self, line: str, depth: int = 1):
        self.lines.append("    " * depth + line)

    # -- values outside loops ------------------------------------------------------------

    def array_of(self, node) -> str:
        """An expression for node's value as an array (it must be materialized)."""
        if node.op == "const":
            if np.ndim(node.attrs["value"]) == 0:
                return f"np.full((1,), {self.ctx.const(node.attrs['value'], node.dtype)})"
            return self.ctx.array_const(node)
        return self.ctx.var(node)

    # -- units --------------------------------------------------------------------------------

    def unit(self, unit, units_of):
        if isinstance(unit, NodeUnit):
            node_rules.emit_node(self, unit.node)
        else:
            from .loops import emit_group
            emit_group(self, unit, units_of)


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
        from .split import lower_split
        program = lower_split(graph, units, costs, mathlib, parallel, budget) or program
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


def code_lines(lines) -> int:
    """Emitted lines that are code (comments aside): the size measure of a kernel."""
    return sum(1 for line in lines if not line.lstrip().startswith("#"))


def _lower_single(graph, units, mathlib, parallel):
    """The one-entry program plus each unit's cost in code lines."""
    ctx = Context(graph, mathlib, parallel)
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
    source = "\n".join(em.lines) + "\n"
    program = Program(source, "entry", ctx.globals, units, ctx.shape_generic, ctx.uses_blas)
    program.single_output = len(outs) == 1
    program.parallel = ctx.uses_prange
    program.cost = sum(costs) + 2
    program.notes.append(f"buffers reused: {em.planner.reused}")
    return program, costs


def unit_cost(unit, lines) -> int:
    """What a unit costs Numba to compile, in code lines."""
    extra = 0
    if isinstance(unit, NodeUnit) and unit.node.op == "cat":
        extra = CAT_OPERAND_COST * len(unit.node.inputs)
    return code_lines(lines) + extra


def emit_unit(em, unit, units_of):
    """Append one unit's lines, then let its dead buffers be reused."""
    em.unit(unit, units_of)
    if isinstance(unit, NodeUnit) and unit.node.op == "matmul" and len(unit.node.shape) == 2:
        em.planner.adopt(unit.node, em.ctx.var(unit.node), 2, unit.node.dtype.name)
    em.planner.release_after(unit.index)


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


__all__ = ["LoopGroup", "NodeUnit", "Program", "LoweringError", "lower", "check_supported",
           "reduce_identity", "is_reduction", "kernel_budget", "kernel_cap", "KERNEL_BUDGET",
           "KERNEL_CAP"]
