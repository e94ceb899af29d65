"""The pieces of Numba source generation shared by one-function and split programs:
the `Program` record, naming and constants (`Context`), the line emitter, and how one
fused unit is emitted and what it costs.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import LoweringError
from ..ir import pad_shape as _pad
from ..passes.fusion import NodeUnit
from . import node_rules
from .loops import emit_group
from .rules import libm_name

# Loop nests with at least this many iterations run their outer loop in parallel.
PARALLEL_THRESHOLD = 1 << 20


@dataclass
class Program:
    """Generated source plus what the runtime needs to call it."""

    source: str
    entry: str
    globals: dict
    units: list
    shape_generic: bool
    uses_blas: bool = False
    large_products: bool = False  # holds a product BLAS should run on several threads
    notes: list = field(default_factory=list)
    single_output: bool = False  # the entry returns one array, not a tuple
    parallel: bool = False  # uses numba.prange (compile with parallel=True)
    # A split program: its distinct kernels (`split.Chunk`) and the plain-Python driver
    # source (`entry`, calling them as c0, c1, ...; `globals` are the driver's).
    chunks: list = field(default_factory=list)
    driver: str = ""
    cost: int = 0  # emitted lines (comments aside) Numba compiles
    may_exit: bool = False  # raises "hn-loop..." for sizes that give a loop no trip count


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
        self.may_exit = False  # a loop whose trip count comes from sizes (loop_rule)
        self.bodies = {}  # LoopSpec key -> (its body's Program, outputs that may alias)
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

    def anchored_slice(self, var, index, shape) -> str:
        """The subscript of a slice of `var` (traced `shape`): a dim's bounds nearer the
        traced dim's end than its start are written from the runtime end (the same for
        exact shapes; x[-2] of any length reads the same code)."""
        parts = []
        for d, ((a, b, c), size) in enumerate(zip(index, shape)):
            if size - b < a:
                end = f"{var}.shape[{d}]"
                stop = end if b == size else f"{end} - {size - b}"
                parts.append(f"{end} - {size - a}:{stop}:{c}")
            else:
                parts.append(f"{a}:{b}:{c}")
        return ", ".join(parts) or ":"

    def math(self, name, dtype, optional=False):
        fast = self.mathlib.get(f"{name}_{np.dtype(dtype).name[:1]}{np.dtype(dtype).itemsize * 8}")
        if fast is not None:
            alias = f"{name}_fast"
            self.globals[alias] = fast
            return alias
        if optional:
            return None
        if name == "erf":
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
            emit_group(self, unit, units_of)


def code_lines(lines) -> int:
    """Emitted lines that are code (comments aside): the size measure of a kernel."""
    return sum(1 for line in lines if not line.lstrip().startswith("#"))


def unit_cost(unit, lines) -> int:
    """What a unit costs Numba to compile, in code lines."""
    extra = node_rules.operand_cost(unit.node) if isinstance(unit, NodeUnit) else 0
    return code_lines(lines) + extra


def emit_unit(em, unit, units_of):
    """Append one unit's lines, then let its dead buffers be reused."""
    em.unit(unit, units_of)
    if isinstance(unit, NodeUnit) and node_rules.fresh_output(unit.node):
        em.planner.adopt(unit.node, em.ctx.var(unit.node), 2, unit.node.dtype.name)
    em.planner.release_after(unit.index)


__all__ = ["Program", "Context", "LoweringError", "code_lines", "emit_unit", "unit_cost"]
