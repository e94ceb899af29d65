"""Loop nodes: a repeated region of a graph as one node that runs a body graph per step.

`compiler.reroll` finds a region recorded T times (a Python loop, unrolled by tracing)
and replaces it by a `loop` node and its `loop_out` projections:

    loop(carried inits..., invariants..., sequences...; spec) -> (final carried...,
                                                                   collected...)

The body graph takes (carried..., invariants..., one step's slice of each sequence...)
and returns (next carried..., one step's collected values...). A *sequence* is a value
sliced along one dim at a start that moves by `stride` each step (x[t], x[:, t:t+1], a
value collected by an earlier loop read back in reverse). A *collected* value is one
step's value written into a block of the loop's output (the concatenation along `dim`
of every step's value, as `cat(outputs, dim)` builds it; dim -1: stacked on a new
leading axis). The trip count comes from the sequences' sizes at run time
(`trip_count`): the same node, and the same compiled kernel, runs every length.
"""

from dataclasses import dataclass

import numpy as np

from . import interpret
from .errors import OpError, ShapeError
from .registry import REGISTRY, OpDef, Trait, register

_LOOP_DTYPE = np.dtype(np.bool_)  # (the loop node itself only feeds its projections)


class LoopTripError(OpError):
    """The sequences of a loop do not give one trip count of at least 1."""


@dataclass(frozen=True)
class SeqIn:
    """How one sequence is sliced: along `dim`, `width` wide, the start moving by `stride`.

    stride > 0: step k starts at `anchor + k * stride` and the last step ends `gap`
    before the end; stride < 0: step k starts at `n - anchor + k * stride` and the last
    starts at `gap`. So the trip count follows from the size n (`trip`).
    """

    dim: int
    width: int
    stride: int
    anchor: int
    gap: int

    def trip(self, n: int) -> int:
        """The trip count a size-n dim gives (raises LoopTripError when none does)."""
        span = n - self.anchor - self.width - self.gap if self.stride > 0 else \
            n - self.anchor - self.gap
        step = abs(self.stride)
        if span < 0 or span % step:
            raise LoopTripError(f"loop: a sequence of size {n} along dim {self.dim} fits no "
                                f"whole number of steps ({self})")
        return span // step + 1

    def start(self, n: int, k: int) -> int:
        """Where step k's slice starts in a size-n dim."""
        return self.anchor + k * self.stride if self.stride > 0 else \
            n - self.anchor + k * self.stride


@dataclass(frozen=True)
class Collect:
    """Where a step's value goes: block k (T-1-k when `reverse`) along `dim` (-1: a new
    leading axis)."""

    dim: int
    reverse: bool = False


@dataclass(frozen=True)
class Pick:
    """One step's value of collected body output `index` as an output of its own: step
    `step` (counted from the last when `from_end`), so the loop need not keep them all."""

    index: int
    step: int
    from_end: bool = False

    def at(self, trip: int) -> int:
        """The step picked in a loop of `trip` steps (LoopTripError when there is none)."""
        k = trip - 1 - self.step if self.from_end else self.step
        if not 0 <= k < trip:
            raise LoopTripError(f"loop: {trip} steps have no step {self}")
        return k


class LoopSpec:
    """A loop node's attribute: the body graph and how its inputs and outputs map.

    Compared and printed by `key` (the body's exact structure, the counts and the maps;
    the trip count only when no sequence gives it), so loops that differ only in their
    trip count hash alike.
    """

    def __init__(self, body, n_carried, n_invariant, seqs, collects, trip, picks=()):
        self.body = body
        self.n_carried, self.n_invariant = n_carried, n_invariant
        self.seqs, self.collects = tuple(seqs), tuple(collects)
        self.picks = tuple(picks)
        self.trip = trip  # the trip count seen when tracing (used when there is no sequence)
        fixed = () if self.seqs else (trip,)
        self.key = repr((body.structural_hash(exact_shapes=True), n_carried, n_invariant,
                         self.seqs, self.collects, self.picks) + fixed)

    def with_picks(self, picks) -> "LoopSpec":
        """The same loop with these picked outputs after the collected ones."""
        return LoopSpec(self.body, self.n_carried, self.n_invariant, self.seqs, self.collects,
                        self.trip, picks)

    def __repr__(self) -> str:
        return f"LoopSpec({self.key})"

    def __eq__(self, other) -> bool:
        return isinstance(other, LoopSpec) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def n_collected(self) -> int:
        return len(self.collects)

    def seq_bases(self, inputs) -> list:
        """The sequence inputs among a loop node's inputs."""
        return list(inputs[self.n_carried + self.n_invariant:])

    def trip_of(self, base_shapes) -> int:
        """The trip count the sequences' shapes give (all must agree, and be >= 1)."""
        if not self.seqs:
            return self.trip
        trips = {s.trip(shape[s.dim]) for s, shape in zip(self.seqs, base_shapes)}
        if len(trips) != 1:
            raise LoopTripError(f"loop: its sequences give different trip counts {sorted(trips)}")
        trip = trips.pop()
        if trip < 1:
            raise LoopTripError(f"loop: trip count {trip} (at least 1 step is needed)")
        return trip

    def output_types(self, input_shapes) -> list:
        """(shape, dtype) of each output: the final carried values, then the collected."""
        trip = self.trip_of(self.seq_bases(input_shapes))
        outs = self.body.outputs
        types = [(tuple(o.shape), o.dtype) for o in outs[:self.n_carried]]
        for c, o in zip(self.collects, outs[self.n_carried:]):
            types.append((collected_shape(o.shape, c, trip), o.dtype))
        for p in self.picks:
            p.at(trip)
            o = outs[self.n_carried + p.index]
            types.append((tuple(o.shape), o.dtype))
        return types


def collected_shape(step_shape, collect, trip) -> tuple:
    """The shape of `trip` steps of `step_shape` collected as `collect` says."""
    if collect.dim < 0:
        return (trip,) + tuple(step_shape)
    shape = list(step_shape)
    shape[collect.dim] *= trip
    return tuple(shape)


def step_index(ndim, dim, start, width) -> tuple:
    """A NumPy index selecting [start, start + width) along `dim`."""
    return tuple(slice(start, start + width) if d == dim else slice(None) for d in range(ndim))


def _loop_infer(shapes, dtypes, spec):
    body = spec.body
    k, n = spec.n_carried, spec.n_invariant
    if len(shapes) != len(body.inputs):
        raise OpError(f"loop: {len(shapes)} inputs for a body of {len(body.inputs)}")
    for i, (shape, dtype, node) in enumerate(zip(shapes, dtypes, body.inputs)):
        want = tuple(node.shape)
        if i >= k + n:
            seq = spec.seqs[i - k - n]
            want = tuple(shape[d] if d == seq.dim else s for d, s in enumerate(want))
        if tuple(shape) != want or np.dtype(dtype) != node.dtype:
            raise ShapeError(f"loop: input {i} is {np.dtype(dtype)}{list(shape)}, its body "
                             f"takes {node.type_str()}")
    spec.trip_of(spec.seq_bases(shapes))
    return (), _LOOP_DTYPE


def _loop_impl(*arrays, spec):
    """Run the body once per step with the reference interpreter (the oracle)."""
    k, n = spec.n_carried, spec.n_invariant
    bases = arrays[k + n:]
    trip = spec.trip_of([b.shape for b in bases])
    carried, invariant = list(arrays[:k]), list(arrays[k:k + n])
    steps = [[] for _ in spec.collects]
    for t in range(trip):
        slices = [b[step_index(b.ndim, s.dim, s.start(b.shape[s.dim], t), s.width)]
                  for s, b in zip(spec.seqs, bases)]
        outs = interpret.run(spec.body, *carried, *invariant, *slices)
        carried = outs[:k]
        for acc, value in zip(steps, outs[k:]):
            acc.append(value)
    collected = []
    for c, acc in zip(spec.collects, steps):
        acc = acc[::-1] if c.reverse else acc
        collected.append(np.stack(acc) if c.dim < 0 else np.concatenate(acc, axis=c.dim))
    picked = [steps[p.index][p.at(trip)] for p in spec.picks]
    return tuple(carried) + tuple(collected) + tuple(picked)


def is_loop(node) -> bool:
    """A loop node (control flow whose type rule is its own, not a projection's)."""
    opdef = REGISTRY[node.op]
    return opdef.has(Trait.CONTROL) and opdef.infer_node is None


def is_projection(node) -> bool:
    """One output of a multi-output node (a loop's loop_out): its type comes from it."""
    return REGISTRY[node.op].infer_node is not None


def _loop_out_infer_node(node):
    loop = node.inputs[0]
    types = loop.attrs["spec"].output_types([i.shape for i in loop.inputs])
    return types[node.attrs["index"]]


def _loop_out_infer(shapes, dtypes, index):
    raise OpError("loop_out: its type comes from its loop node (OpDef.infer_node)")


LOOP = register(OpDef(
    "loop", -1, _loop_impl, _loop_infer, attrs=("spec",), traits=frozenset({Trait.CONTROL}),
    saves=frozenset(),
    doc="A rerolled loop: runs its body graph once per step (see compiler.loop)."))

LOOP_OUT = register(OpDef(
    "loop_out", 1, lambda results, index: results[index], _loop_out_infer, attrs=("index",),
    traits=frozenset({Trait.CONTROL, Trait.PURE}), saves=frozenset(),
    infer_node=_loop_out_infer_node,
    doc="Output `index` of a loop node: a final carried value or a collected one."))


def traced_trip(node) -> int:
    """The trip count of loop node `node` at the (traced) shapes of its inputs."""
    spec = node.attrs["spec"]
    return spec.trip_of(spec.seq_bases([i.shape for i in node.inputs]))


def describe(graph) -> list:
    """Text lines on each loop node of `graph`: how its trip count is found, what it
    carries, reads and collects, and its body graph."""
    names = graph.names()
    lines = []
    for node in graph.nodes:
        spec = node.attrs.get("spec") if is_loop(node) else None
        if spec is None:
            continue
        k, n = spec.n_carried, spec.n_invariant
        bases = spec.seq_bases(node.inputs)
        trip = spec.trip_of([b.shape for b in bases])
        how = "; ".join(f"{names.get(id(b), '?')} dim {s.dim}, {s.width} wide, start "
                        + (f"{s.anchor} + {s.stride}*t" if s.stride > 0 else
                           f"size - {s.anchor} - {-s.stride}*t")
                        for s, b in zip(spec.seqs, bases)) or f"fixed at {spec.trip}"
        lines.append(f"loop {names.get(id(node), '?')}: {trip} steps when traced; trip count "
                     f"from {how}")
        lines.append(f"  carried {k}, invariant inputs {n}, collected {spec.n_collected} "
                     f"({', '.join(_collect_text(c) for c in spec.collects) or '-'}), picked "
                     f"{len(spec.picks)}")
        lines.append("  body:")
        lines.extend("    " + ln for ln in str(spec.body).splitlines())
        lines.extend("    " + ln for ln in describe(spec.body))  # (nested loops)
    return lines


def _collect_text(c) -> str:
    where = "new axis" if c.dim < 0 else f"dim {c.dim}"
    return where + (" reversed" if c.reverse else "")
