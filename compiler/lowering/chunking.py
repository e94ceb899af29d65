"""Where to cut a long lowered program into kernels, so that repeats share one kernel.

Each unit (fused loop group or single op) gets a signature: its ops, attributes,
shapes and dtypes, with every input named by where it comes from relative to the
unit (the unit k places back, a graph input, a constant). The steps of a loop
unrolled by tracing then have equal signatures one period apart. The planner
finds the period that repeats most, cuts the repeating region at multiples of it
(as many periods per kernel as the budget holds, or the same cuts inside every
period when one period is too long), and cuts what comes before and after greedily
(recursively looking for further repeats there). Identical cuts give identical
kernel source (`compiler.lowering.split`), which is compiled once and shared.
Signatures only steer the cuts; whether two kernels are shared is decided by
comparing their generated source, so a wrong guess costs a compile, never a result.
"""

import numpy as np

from ..passes.fusion import LoopGroup
from .node_rules import PARAMETRIZED

# Periods longer than this many units are not looked for (bounds the search cost).
MAX_PERIOD = 4096
# A region is treated as repeating only with at least this many whole periods.
MIN_REPEATS = 3
# Inputs this many ops or fewer from graph inputs and constants are named by content;
# inputs computed more than FAR units back by their op (see `signatures`).
SHALLOW = 3
FAR = 512
# A kernel of repeated periods holds at most budget // SHARED_FRACTION lines of them.
SHARED_FRACTION = 4


def _attr_key(node, name, value):
    if (node.op, name) in PARAMETRIZED:
        return len(value)  # a kernel argument: the values do not shape the code
    if isinstance(value, np.ndarray):
        if node.op == "const" and value.ndim:
            return ("array", value.shape, value.dtype.str)  # an argument too
        return ("array", value.shape, value.dtype.str, value.tobytes().hex())
    return repr(value)


def _node_key(node):
    attrs = tuple(sorted((k, _attr_key(node, k, v)) for k, v in node.attrs.items()))
    return (node.op, attrs, tuple(node.shape), node.dtype.str)


def signatures(units, graph_inputs) -> list:
    """One small int per unit; equal for units that lower alike at the same relative
    position (the steps of an unrolled loop).

    An input is named by what it computes when that is a short expression of graph
    inputs and constants (a transposed weight that CSE made one node for all steps,
    the slice of the input a step reads: at most SHALLOW ops deep), else by how many
    units back it was computed; more than FAR units back, by its op alone (a value
    computed once and read by every step)."""
    where = {}
    for unit in units:
        for k, node in enumerate(unit.nodes):
            where[id(node)] = (unit.index, k)
    table = {}

    def intern(key):
        return table.setdefault(repr(key), len(table))

    shallow = {id(n): (intern(("in", k)), 0) for k, n in enumerate(graph_inputs)}
    sigs = []
    for unit in units:
        parts = [type(unit).__name__]
        if isinstance(unit, LoopGroup):
            parts.append((unit.domain, unit.inner, unit.buffer_reductions))
        for node in unit.nodes:
            refs, depth = [], 0
            for inp in node.inputs:
                if inp.op == "const" and id(inp) not in shallow:
                    shallow[id(inp)] = (intern(("const",) + _node_key(inp)), 0)
                if id(inp) in shallow:
                    key, d = shallow[id(inp)]
                    refs.append(("expr", key))
                    depth = max(depth, d + 1)
                    continue
                depth = SHALLOW + 1
                u, k = where[id(inp)]
                far = unit.index - u > FAR
                refs.append(("far",) + _node_key(inp) if far else (unit.index - u, k))
            if depth <= SHALLOW:
                shallow[id(node)] = (intern((_node_key(node), tuple(refs))), depth)
            parts.append((_node_key(node), tuple(refs)))
        sigs.append(intern(parts))
    return sigs


def best_period(sigs):
    """(period, start, repeats) of the longest run that repeats with the period that
    matches most often, or None when nothing repeats MIN_REPEATS times."""
    a = np.asarray(sigs, dtype=np.int64)
    n = len(a)
    best, period = 0, 0
    for p in range(1, min(MAX_PERIOD, n // MIN_REPEATS) + 1):
        m = int(np.count_nonzero(a[:-p] == a[p:]))
        if m > best:
            best, period = m, p
    if not period:
        return None
    same = np.concatenate(([False], a[:-period] == a[period:], [False]))
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))
    starts, ends = edges[::2], edges[1::2]
    k = int(np.argmax(ends - starts))
    start, run = int(starts[k]), int(ends[k] - starts[k])
    repeats = (run + period) // period
    if repeats < MIN_REPEATS:
        return None
    return period, start, repeats


def greedy(costs, lo, hi, budget) -> list:
    """Cut [lo, hi) into consecutive pieces of at most `budget` cost and about equal size
    (a unit costing more than the budget is a piece of its own): the cut points."""
    total = sum(costs[lo:hi])
    target = total / max(1, -(-total // budget))
    cuts, used = [], 0
    for i in range(lo, hi):
        if used and (used + costs[i] > budget or used >= target):
            cuts.append(i)
            used = 0
        used += costs[i]
    return cuts


def plan(costs, sigs, budget, alone=()) -> list:
    """Kernel boundaries: a list of (start, stop) unit ranges covering all units; the
    units in `alone` get a range of their own (the driver runs them)."""
    n = len(costs)
    cuts = set()
    lo = 0
    for i in sorted(alone) + [n]:
        cuts.update(_cuts(costs, sigs, lo, i, budget, depth=0))
        cuts.update((i, i + 1))
        lo = i + 1
    bounds = [0] + sorted(c for c in cuts if 0 < c < n) + [n]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _cuts(costs, sigs, lo, hi, budget, depth) -> list:
    if sum(costs[lo:hi]) <= budget:
        return []
    found = best_period(sigs[lo:hi]) if depth < 4 else None
    if found is None:
        return greedy(costs, lo, hi, budget)
    period, start, repeats = found
    start += lo
    stop = start + period * repeats
    cuts = [start, stop]
    cuts += _cuts(costs, sigs, lo, start, budget, depth + 1)
    cuts += _cuts(costs, sigs, stop, hi, budget, depth + 1)
    per_period = max(1, sum(costs[start:start + period]))
    if per_period <= budget:
        # k periods a kernel, k filling a share of the budget (every distinct kernel is
        # compiled once: shorter shared kernels compile sooner); leftovers one each
        k = max(1, min(repeats, budget // SHARED_FRACTION // per_period))
        whole = start + repeats // k * k * period
        cuts += range(start + k * period, whole, k * period)
        cuts += range(whole, stop, period)
    else:  # the same cuts inside every period
        inner = [c - start for c in greedy(costs, start, start + period, budget)]
        for k in range(repeats):
            base = start + k * period
            cuts.append(base)
            cuts += [base + c for c in inner]
    return [c for c in cuts if lo < c < hi]
