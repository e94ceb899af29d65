"""Lower an optimized graph to the Python source of one Numba entry function.

The entry takes the graph inputs (0-d arrays are passed as 1-element 1-d arrays)
and returns a tuple of output arrays. Each fused `LoopGroup` becomes one loop
nest written inline, each `NodeUnit` a few NumPy calls Numba supports, so a
traced call crosses into machine code once. Loop bounds come from the input
arrays at run time; where a size cannot (a reshape to a fixed shape, say), the
program is marked `shape_generic=False` and is reused only for exact shapes.
"""

from dataclasses import dataclass, field

import numpy as np

from ..errors import OpError
from ..passes.fusion import LoopGroup, NodeUnit, partition
from . import node_rules
from .buffers import BufferPlanner
from .rules import REDUCE_COMBINE, RULES, libm_name, reduce_identity

# Loop nests with at least this many iterations run their outer loop in parallel.
PARALLEL_THRESHOLD = 1 << 20


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


def _pad(shape) -> tuple:
    return tuple(shape) if len(shape) else (1,)


class Context:
    """Naming, typed constants and math-function choice during codegen."""

    def __init__(self, graph, mathlib=None, parallel=False):
        self.graph = graph
        self.parallel = parallel
        self.parallel_threshold = PARALLEL_THRESHOLD
        self.uses_prange = False
        self.index = {id(n): i for i, n in enumerate(graph.nodes)}
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
    def __init__(self, graph, ctx):
        self.graph, self.ctx = graph, ctx
        self.lines = []
        self.users = graph.users()
        self.outputs = {id(o) for o in graph.outputs}
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


def lower(graph, mathlib=None, parallel=False) -> Program:
    """Generate the Numba entry for `graph` (an optimized clone).

    parallel=True lets loop nests over at least PARALLEL_THRESHOLD elements split their
    outermost loop across threads (numba.prange)."""
    units = partition(graph)
    ctx = Context(graph, mathlib, parallel)
    em = _Emitter(graph, ctx)
    units_of = {}
    for unit in units:
        for node in unit.nodes:
            units_of[id(node)] = unit
    em.planner = BufferPlanner(graph, units_of)
    args = ", ".join(ctx.var(n) for n in graph.inputs)
    em.lines.append(f"def entry({args}):")
    for unit in units:
        em.unit(unit, units_of)
        if isinstance(unit, NodeUnit) and unit.node.op == "matmul" and len(unit.node.shape) == 2:
            em.planner.adopt(unit.node, ctx.var(unit.node), 2, unit.node.dtype.name)
        em.planner.release_after(unit.index)
    outs = [em.array_of(o) for o in graph.outputs]
    if len(outs) == 1:  # a bare array: Numba boxes it faster than a 1-tuple
        em.emit(f"return {outs[0]}")
    else:
        em.emit(f"return ({', '.join(outs)}{',' if outs else ''})")
    source = "\n".join(em.lines) + "\n"
    program = Program(source, "entry", ctx.globals, units, ctx.shape_generic, ctx.uses_blas)
    program.single_output = len(outs) == 1
    program.parallel = ctx.uses_prange
    program.notes.append(f"buffers reused: {em.planner.reused}")
    return program


def check_supported(graph) -> None:
    """Raise LoweringError naming the first op with no lowering rule."""
    for node in graph.nodes:
        if node.is_source:
            continue
        if node.op not in RULES and node.op not in node_rules.NODE_RULES and \
                node.op not in REDUCE_COMBINE:
            raise LoweringError(f"the numba backend cannot lower op {node.op!r} yet")
        if any(d == 0 for d in node.shape):
            raise LoweringError(f"{node.op}: size-0 dims are run eagerly ({node.type_str()})")


__all__ = ["LoopGroup", "NodeUnit", "Program", "LoweringError", "lower", "check_supported",
           "reduce_identity"]
