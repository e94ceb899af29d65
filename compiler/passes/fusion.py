"""Fusion: partition a graph into units that lower to one loop nest each.

A `LoopGroup` is a maximal set of elementwise ops over one iteration domain,
with reductions as epilogues. When its reductions fold the trailing dims
("row" reductions, as in softmax, log_softmax, layer_norm), the group runs in
phases inside one loop over the outer dims: each phase is an inner loop that
computes elementwise values and accumulates reductions whose results later
phases broadcast back. Other reductions accumulate into a buffer. Every other
op (matmul, movement, gather...) is a `NodeUnit` of its own.
Fusion asks the registry's traits, never op names: ELEMENTWISE ops and BROADCAST
movements (expand, detach: a broadcasting read) fuse.
"""

from dataclasses import dataclass, field

from ..ir import pad_shape as _pad
from ..registry import REGISTRY, Trait


def is_pointwise(node) -> bool:
    """True for ops computed one output element at a time from aligned inputs."""
    traits = REGISTRY[node.op].traits
    return Trait.ELEMENTWISE in traits or Trait.BROADCAST in traits


def is_fusable_reduction(node) -> bool:
    """sum/max/min (value-folding reductions), not arg-reductions."""
    op = REGISTRY[node.op]
    return op.has(Trait.REDUCTION) and not op.has(Trait.ARG_REDUCTION)


def _source_view(node) -> bool:
    """A movement of graph inputs or constants only (a bias reshaped to (C, 1, 1)): it
    can run before everything, so no group has to end where it was recorded."""
    return not node.is_source and not is_pointwise(node) and \
        REGISTRY[node.op].has(Trait.MOVEMENT) and all(i.is_source for i in node.inputs)


@dataclass(eq=False)
class NodeUnit:
    """A single op lowered on its own."""

    node: object
    index: int

    @property
    def nodes(self):
        return [self.node]


@dataclass(eq=False)
class LoopGroup:
    """Fused nodes over `domain`; the last `inner` dims are reduced by row reductions."""

    domain: tuple
    index: int
    nodes: list = field(default_factory=list)
    inner: int = 0
    phase: dict = field(default_factory=dict)  # id(node) -> phase
    row_level: set = field(default_factory=set)  # ids of nodes computed once per row
    buffer_reductions: bool = False

    @property
    def outer(self) -> int:
        return len(self.domain) - self.inner

    def row_shapes(self) -> tuple:
        if not self.inner:
            return ()
        outer = self.domain[:self.outer]
        return (outer + (1,) * self.inner, outer)

    def holds(self, node) -> bool:
        return any(n is node for n in self.nodes)


class _Partitioner:
    def __init__(self, graph):
        self.graph = graph
        self.units = []
        self.unit_of = {}
        self.by_domain = {}  # domain -> its LoopGroups, oldest first

    def run(self):
        hoisted = [n for n in self.graph.nodes if _source_view(n)]
        for node in hoisted:  # (first: a group may then read them wherever it starts)
            self._new_node_unit(node)
        for node in self.graph.nodes:
            if node.is_source or id(node) in self.unit_of:
                continue
            if is_pointwise(node):
                self._place_pointwise(node)
            elif is_fusable_reduction(node):
                self._place_reduction(node)
            else:
                self._new_node_unit(node)
        return self.units

    # -- helpers ------------------------------------------------------------------------

    def _inputs_ready_for(self, node, group) -> bool:
        for inp in node.inputs:
            unit = self.unit_of.get(id(inp))
            if unit is not None and unit is not group and unit.index > group.index:
                return False
        return True

    def _groups_of_inputs(self, node):
        seen = []
        for inp in node.inputs:
            unit = self.unit_of.get(id(inp))
            if isinstance(unit, LoopGroup) and unit not in seen:
                seen.append(unit)
        return seen

    def _join(self, group, node, phase, row=False):
        group.nodes.append(node)
        group.phase[id(node)] = phase
        if row:
            group.row_level.add(id(node))
        self.unit_of[id(node)] = group

    def _new_group(self, domain, node, **kw):
        group = LoopGroup(_pad(domain), len(self.units))
        self.units.append(group)
        self.by_domain.setdefault(group.domain, []).append(group)
        if node is not None:
            self._join(group, node, 0, **kw)
        return group

    def _new_node_unit(self, node):
        unit = NodeUnit(node, len(self.units))
        self.units.append(unit)
        self.unit_of[id(node)] = unit

    # -- pointwise ------------------------------------------------------------------------

    def _candidates(self, node, shape):
        """Groups of the node's inputs first, then earlier groups over the same domain
        (independent chains over one domain share one loop nest)."""
        found = self._groups_of_inputs(node)
        # a group older than an input's unit fails _inputs_ready_for: stop there (this
        # keeps partitioning linear in long graphs)
        floor = max((u.index for u in map(self.unit_of.get, map(id, node.inputs))
                     if u is not None), default=-1)
        for unit in reversed(self.by_domain.get(shape, ())):
            if unit.index < floor:
                break
            if unit not in found:
                found.append(unit)
        return found

    def _place_pointwise(self, node):
        shape = _pad(node.shape)
        for group in self._candidates(node, shape):
            if group.buffer_reductions or not self._inputs_ready_for(node, group):
                continue
            if shape == group.domain and self._full_ok(node, group):
                self._join(group, node, self._full_phase(node, group))
                return
            if group.inner and tuple(node.shape) in group.row_shapes() and \
                    self._row_ok(node, group):
                self._join(group, node, self._row_phase(node, group), row=True)
                return
        self._new_group(shape, node)

    def _full_ok(self, node, group) -> bool:
        keep = group.row_shapes()[:1]
        for inp in node.inputs:
            if group.holds(inp) and id(inp) in group.row_level and tuple(inp.shape) not in keep:
                return False  # a non-keepdim row value would broadcast along the wrong dims
        return True

    def _row_ok(self, node, group) -> bool:
        return all(id(i) in group.row_level for i in node.inputs if group.holds(i))

    def _full_phase(self, node, group) -> int:
        phase = 0
        for inp in node.inputs:
            if group.holds(inp):
                p = group.phase[id(inp)]
                phase = max(phase, p + 1 if id(inp) in group.row_level else p)
        return phase

    def _row_phase(self, node, group) -> int:
        return max((group.phase[id(i)] for i in node.inputs if group.holds(i)), default=0)

    # -- reductions -----------------------------------------------------------------------

    def _place_reduction(self, node):
        src = node.inputs[0]
        dims = tuple(node.attrs["dims"])
        rank = len(src.shape)
        group = self.unit_of.get(id(src))
        fits = (isinstance(group, LoopGroup) and group.domain == _pad(src.shape)
                and id(src) not in group.row_level and not group.buffer_reductions
                and self._inputs_ready_for(node, group))
        trailing = bool(dims) and dims == tuple(range(rank - len(dims), rank))
        if fits and trailing and group.inner in (0, len(dims)):
            group.inner = len(dims)
            self._join(group, node, group.phase[id(src)], row=True)
            return
        if fits and not group.inner and not trailing:
            group.buffer_reductions = True
            self._join(group, node, 0)
            return
        if trailing and rank:
            group = self._new_group(src.shape, None)
            group.inner = len(dims)
            self._join(group, node, 0, row=True)
            return
        group = self._new_group(src.shape, None)
        group.buffer_reductions = True
        self._join(group, node, 0)


def partition(graph) -> list:
    """Split `graph` into emission units (LoopGroup / NodeUnit), in execution order."""
    return _Partitioner(graph).run()


def describe(units) -> list:
    """A printable summary: one line per unit with its ops."""
    lines = []
    for unit in units:
        ops = ", ".join(n.op for n in unit.nodes)
        if isinstance(unit, LoopGroup):
            extra = f" inner={unit.inner}" if unit.inner else ""
            lines.append(f"kernel {unit.index}: loop over {list(unit.domain)}{extra}: {ops}")
        else:
            lines.append(f"kernel {unit.index}: {ops}")
    return lines
