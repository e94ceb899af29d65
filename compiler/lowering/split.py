"""Split lowering: a long program as bounded kernels called by a plain-Python driver.

Numba compiles one function in time (and memory) that grows much faster than its
length, so a program over the kernel budget is cut into kernels of bounded size
(`chunking.plan`). Each kernel is emitted on its own with names numbered from its
first use (`v0, v1, ...`; loop sizes `d0_0, ...`; constants `K0, ...`), takes the
arrays it reads as arguments (graph inputs, earlier kernels' results, array
constants) and the integers of its static slices as one int64 array `Z`, and
returns what later kernels or the caller read. Kernels of equal source are one
kernel: the steps of an unrolled loop compile once. The driver, `entry(inputs)`,
calls them in order, drops each array after its last use and returns the outputs.
"""

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from ..passes.fusion import NodeUnit
from . import chunking, node_rules
from .buffers import BufferPlanner
from .emit import Context, Program, _Emitter, code_lines, emit_unit


@dataclass
class Chunk:
    """One distinct kernel: self-contained source (`def chunk(...)`) and its globals."""

    source: str
    globals: dict
    key: str
    cost: int
    parallel: bool = False
    entry: str = "chunk"
    uses: int = 0  # how many calls of the driver run it


@dataclass
class _Call:
    """One step of the driver: a kernel call (chunk >= 0) or a NumPy concatenation."""

    params: list  # nodes passed as array arguments, in order
    results: list = field(default_factory=list)  # nodes it defines, in order
    ints: list = field(default_factory=list)  # the Z argument (empty: none)
    chunk: int = -1
    node: object = None  # the cat node the driver runs itself


class _Numbering(dict):
    """id -> number, handed out in order of first lookup."""

    def __missing__(self, key):
        value = self[key] = len(self)
        return value


class ChunkContext(Context):
    """Codegen context for one kernel: local names, arguments recorded as they are read."""

    def __init__(self, graph, mathlib, parallel, members):
        super().__init__(graph, mathlib, parallel, index=_Numbering())
        self.members = members
        self.params = []
        self._param_ids = set()
        self.ints = []
        self._groups = _Numbering()

    def var(self, node) -> str:
        key = id(node)
        if key not in self.members and key not in self._param_ids:
            self._param_ids.add(key)
            self.params.append(node)
        return f"v{self.index[key]}"

    def array_const(self, node) -> str:
        return self.var(node)  # array constants are arguments (the driver holds them)

    def group_id(self, group) -> int:
        return self._groups[id(group)]

    def anchored_slice(self, var, index, shape) -> str:
        """As Context.anchored_slice, the integers taken from Z (bounds near the end as
        distances from it)."""
        parts = []
        for d, ((a, b, c), size) in enumerate(zip(index, shape)):
            k = len(self.ints)
            if size - b < a:
                self.ints.extend((size - a, size - b, c))
                end = f"{var}.shape[{d}]"
                parts.append(f"{end} - Z[{k}]:{end} - Z[{k + 1}]:Z[{k + 2}]")
            else:
                self.ints.extend((a, b, c))
                parts.append(f"Z[{k}]:Z[{k + 1}]:Z[{k + 2}]")
        return ", ".join(parts) or ":"

    def slice_text(self, index) -> str:
        parts = []
        for bounds in index:
            k = len(self.ints)
            self.ints.extend(int(b) for b in bounds)
            parts.append(f"Z[{k}]:Z[{k + 1}]:Z[{k + 2}]")
        return ", ".join(parts) or ":"


class _Shared:
    """What every kernel's emission reads: users, buffer lifetimes, unit of each node."""

    def __init__(self, graph, units):
        self.graph, self.units = graph, units
        self.units_of = {id(n): u for u in units for n in u.nodes}
        self.users = graph.users()
        self.outputs = {id(o) for o in graph.outputs}
        self.planner = BufferPlanner(graph, self.units_of)


def _global_key(name, value) -> tuple:
    if isinstance(value, np.generic):
        return (name, value.dtype.str, value.tobytes().hex())
    py = getattr(value, "py_func", value)
    return (name, getattr(py, "__module__", "?"), getattr(py, "__qualname__", repr(py)))


def _emit_body(shared, lo, hi, mathlib, parallel):
    """(context, emitter, members) with the lines of units[lo:hi] (no return yet)."""
    units = shared.units[lo:hi]
    members = [n for u in units for n in u.nodes]
    ctx = ChunkContext(shared.graph, mathlib, parallel, {id(n) for n in members})
    ctx.bodies = shared.bodies
    em = _Emitter(shared.graph, ctx, shared.users, shared.outputs)
    em.planner = shared.planner.fork()
    for unit in units:
        emit_unit(em, unit, shared.units_of)
    body = "\n".join(em.lines)
    # arguments looked up only to be bypassed (x @ W.T hands W to BLAS, not W.T) go
    ctx.params[:] = [p for p in ctx.params if re.search(rf"\b{ctx.var(p)}\b", body)]
    return ctx, em, members


def _finish(ctx, em, results) -> Chunk:
    """The kernel: header with its arguments, the body, the return of `results`."""
    outs = [ctx.var(n) for n in results]
    if len(outs) == 1:  # a bare array: Numba boxes it faster than a 1-tuple
        em.emit(f"return {outs[0]}")
    else:
        em.emit(f"return ({', '.join(outs)},)" if outs else "return 0")
    args = [ctx.var(p) for p in ctx.params] + (["Z"] if ctx.ints else [])
    source = f"def chunk({', '.join(args)}):\n" + "\n".join(em.lines) + "\n"
    names = sorted((k, v) for k, v in ctx.globals.items() if k != "np")
    key = hashlib.sha256(repr((source, [_global_key(k, v) for k, v in names])).encode())
    return Chunk(source, ctx.globals, key.hexdigest(), code_lines(em.lines) + 1,
                 ctx.uses_prange)


def driver_unit(unit) -> bool:
    """Units the driver runs with NumPy: concatenations of many arrays (Numba compiles a
    call with many array operands slowly)."""
    return isinstance(unit, NodeUnit) and node_rules.run_by_driver(unit.node)


def _keep_projections(ranges, units) -> list:
    """Move each cut that falls just before a loop's projections (loop_out: the loop's
    code defines their variables) to after them."""
    cuts = sorted({hi for _, hi in ranges[:-1]})
    moved = []
    for cut in cuts:
        while cut < len(units) and isinstance(units[cut], NodeUnit) and \
                node_rules.defined_by_producer(units[cut].node):
            cut += 1
        moved.append(cut)
    bounds = [ranges[0][0]] + sorted(set(c for c in moved if c < ranges[-1][1])) + \
        [ranges[-1][1]]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def lower_split(graph, units, costs, mathlib, parallel, budget, bodies=None):
    """The split Program for `graph`, or None when the plan keeps one kernel."""
    alone = [u.index for u in units if driver_unit(u)]
    ranges = chunking.plan(costs, chunking.signatures(units, graph.inputs), budget, alone)
    ranges = _keep_projections(ranges, units)
    if len(ranges) < 2 and not alone:
        return None
    shared = _Shared(graph, units)
    shared.bodies = bodies or {}
    calls, bodies = [], []
    for lo, hi in ranges:
        if hi == lo + 1 and driver_unit(units[lo]):
            node = units[lo].node
            calls.append(_Call(list(node.inputs), [node], node=node))
            continue
        ctx, em, members = _emit_body(shared, lo, hi, mathlib, parallel)
        calls.append(_Call(ctx.params, members, ctx.ints))
        bodies.append((calls[-1], ctx, em))
    read = {id(n) for call in calls for n in call.params} | shared.outputs
    chunks, by_key, reused = [], {}, 0
    for call, ctx, em in bodies:
        call.results = [n for n in call.results if id(n) in read]
        chunk = _finish(ctx, em, call.results)
        call.chunk = by_key.setdefault(chunk.key, len(chunks))
        if call.chunk == len(chunks):
            chunks.append(chunk)
        chunks[call.chunk].uses += 1
        reused += em.planner.reused
    driver, driver_globals, single = _driver(graph, calls)
    uses_blas = any(ctx.uses_blas for _, ctx, _ in bodies)
    large = uses_blas and node_rules.large_product(graph)
    driver = (node_rules.BLAS_THREADED if large else "") + driver
    program = Program(_display(driver, chunks, len(calls), budget), "entry", driver_globals,
                      units, all(ctx.shape_generic for _, ctx, _ in bodies), uses_blas)
    program.chunks, program.driver, program.single_output = chunks, driver, single
    program.parallel = any(c.parallel for c in chunks)
    program.large_products = large
    program.may_exit = any(ctx.may_exit for _, ctx, _ in bodies)
    program.cost = sum(c.cost for c in chunks)
    program.notes += [f"buffers reused: {reused}",
                      f"split into {len(calls)} calls of {len(chunks)} distinct kernels "
                      f"(budget {budget} lines)"]
    return program


class _DriverNames:
    """Driver-level names: v<i> per graph node, A<i> per array constant it holds."""

    def __init__(self, graph):
        self.index = {id(n): i for i, n in enumerate(graph.nodes)}
        self.globals = {"np": np}

    def ref(self, node) -> str:
        i = self.index[id(node)]
        if node.op != "const":
            return f"v{i}"
        value = np.asarray(node.attrs["value"], dtype=node.dtype)
        if value.ndim == 0:
            self.globals[f"K{i}"] = node.dtype.type(value)
            return f"np.full((1,), K{i})"
        self.globals[f"A{i}"] = np.ascontiguousarray(value)
        return f"A{i}"


def _driver(graph, calls):
    """(driver source, its globals, single_output): the calls in order, each array
    dropped after its last reader."""
    names = _DriverNames(graph)
    last = {}
    for k, call in enumerate(calls):
        for node in call.params:
            last[id(node)] = k
    keep = {id(n) for n in graph.outputs} | {id(n) for n in graph.inputs}
    lines = [f"def entry({', '.join(names.ref(n) for n in graph.inputs)}):"]
    for k, call in enumerate(calls):
        args = [names.ref(p) for p in call.params]
        if call.node is not None:
            lines.append(f"    {names.ref(call.node)} = np.concatenate(({', '.join(args)},), "
                         f"axis={call.node.attrs['dim']})")
        else:
            if call.ints:
                names.globals[f"Z{k}"] = np.array(call.ints, dtype=np.int64)
                args.append(f"Z{k}")
            lhs = ", ".join(names.ref(n) for n in call.results)
            head = f"{lhs}{',' if len(call.results) > 1 else ''} = " if lhs else ""
            lines.append(f"    {head}c{call.chunk}({', '.join(args)})")
        dead = [names.ref(p) for p in call.params
                if last[id(p)] == k and id(p) not in keep and p.op != "const"]
        if dead:
            lines.append(f"    del {', '.join(dict.fromkeys(dead))}")
    outs = [names.ref(o) for o in graph.outputs]
    if len(outs) == 1:
        lines.append(f"    return {outs[0]}")
    else:
        lines.append(f"    return ({', '.join(outs)}{',' if outs else ''})")
    return "\n".join(lines) + "\n", names.globals, len(outs) == 1


def _display(driver, chunks, n_calls, budget) -> str:
    """Inspectable text of a split program: the driver, then each distinct kernel."""
    head = (f"# split program: {n_calls} kernel calls of {len(chunks)} distinct kernels "
            f"(budget {budget} lines each); the driver is plain Python\n")
    parts = [head + driver]
    for j, chunk in enumerate(chunks):
        parts.append(f"# c{j}: kernel {chunk.key[:12]}, called {chunk.uses}x\n" + chunk.source)
    return "\n\n".join(parts)
