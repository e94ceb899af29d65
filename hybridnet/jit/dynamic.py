"""Symbolic trip counts: one specialization serves every length of a rerolled loop.

A trace whose Python loop was rerolled (`compiler.reroll`) runs a loop node whose trip
count comes from the size of what it iterates over. When a call with another length
misses, it is traced and compiled as usual; if its code then equals the first
specialization's (the same kernels, the same inputs, outputs, guards and updates) and
the two calls differ only in sizes that change as much as a loop's trip count does
(the length of the sequence, not the batch), those dims of those arguments become
symbolic: keys and guard functions ignore them from then on, so
every later length (also one never seen) runs the same compiled code. `trace(fn,
dynamic=False)` keeps every length a specialization of its own.

What the evidence cannot see at the lengths traced: Python code that computes a size or
a value from the sequence's length, `range(min(n, 20))`, `hs[:min(n, 20)]`, `x / min(n,
20)`, or branches on it (`if len(xs) > 50: ...`), may look like sizes that follow the
length at every traced length. So the code for every length (llvm's kernels, or numba's
size-generic code) serves the lengths between the least and the largest traced only
(Hull); a call of another length is a probe: traced (it runs eagerly), its graph
compared with those of the traces the code was made from (three, or two with numba),
and the hull grows to it, or it and the lengths beyond run eagerly. After four probes
confirmed on one side, the lengths beyond are served without one: a cap further out
than every probe goes unseen, as does a size that agrees with the length at every
traced length but not between them (`2 * (n // 2)` traced at even lengths). Such
functions should pass `dynamic=False`.
(Values that differ between the traced lengths keep them exact: runtime.pipeline.
symbolic_kernel compares the graphs' attributes.)
"""


import copy

from compiler.errors import LoweringError
from compiler.loop import is_loop, traced_trip
from compiler.loop_grad import with_detaches
from compiler.lowering.llvm_sym import Bounds, SymbolicError
from compiler.passes.manager import optimize
from compiler.reroll import reroll
from runtime.backends import get_backend
from runtime.executor import SIDE_EXIT, Executable, Outcome
from runtime.pipeline import program_key, symbolic_kernel


def loop_trips(graph) -> tuple:
    """The trip count of each loop of `graph` (and of the loops nested in their bodies)
    whose trip count comes from sizes."""
    trips = []
    for node in graph.nodes:
        spec = node.attrs.get("spec") if is_loop(node) else None
        if spec is None:
            continue
        if spec.seqs:
            trips.append(traced_trip(node))
        trips.extend(loop_trips(spec.body))
    return tuple(trips)


def loop_dims(tg, graph) -> dict:
    """(flat argument index, dim) -> the trip counts of the loops of `graph` (a compiled
    forward, its inputs those of `tg.graph`) that slice their steps from that argument's
    dim, also through the bodies of loops they are nested in (a body's sequence and
    invariant inputs keep their base's dims: a step of a sequence is a slice)."""
    args = {id(n): tg.sources[i].index for i, n in enumerate(graph.inputs)
            if tg.sources[i].kind == "arg"}
    found = {}
    _sliced_args(graph, args, found)
    return {k: tuple(sorted(v)) for k, v in found.items()}


def _sliced_args(graph, args, found) -> None:
    """Add to `found` the trip count of each loop of `graph` under each (argument, dim) it
    slices; `args` maps (by id) the nodes of `graph` that are arguments to their index."""
    for node in graph.nodes:
        spec = node.attrs.get("spec") if is_loop(node) else None
        if spec is None:
            continue
        bases = spec.seq_bases(node.inputs)
        trip = traced_trip(node)
        for seq, base in zip(spec.seqs, bases):
            if id(base) in args:
                found.setdefault((args[id(base)], seq.dim), []).append(trip)
        body_inputs = spec.body.inputs
        inner = {id(body_inputs[k]): args[id(outer)] for k, outer in enumerate(node.inputs)
                 if k >= spec.n_carried and id(outer) in args}
        if inner:
            _sliced_args(spec.body, inner, found)


def trip_dims(known, key, dims, known_result, result) -> bool:
    """Does the size at each of `dims` change, between the two calls, by exactly as much as
    the trip count of every loop that slices its steps from that dim? (A size only Python
    reads, `range(y.shape[0])`, is sliced by no loop; a dim a loop slices with a gap
    that another size sets changes by more or less than that loop's trips.)"""
    for i, d in dims:
        before, after = known_result.loop_dims.get((i, d)), result.loop_dims.get((i, d))
        if not before or not after or len(before) != len(after):
            return False
        change = key[1][i][0][d] - known[1][i][0][d]
        if any(b - a != change for a, b in zip(before, after)):
            return False
    return True


def differing_dims(known, key):
    """The (flat index, dim) where `key`'s tensor shapes differ from `known`'s (a key,
    perhaps with symbolic dims, None), or None when anything else differs."""
    if len(known) != len(key) or known[0] != key[0] or known[2:] != key[2:] or \
            len(known[1]) != len(key[1]):
        return None
    dims = set()
    for i, (a, b) in enumerate(zip(known[1], key[1])):
        if a[1:] != b[1:] or len(a[0]) != len(b[0]):
            return None
        dims.update((i, d) for d, (x, y) in enumerate(zip(a[0], b[0]))
                    if x is not None and x != y)
    return frozenset(dims)


def mask_metas(metas, dims) -> tuple:
    """Tensor metas with the sizes at `dims` ((flat index, dim) pairs) made symbolic."""
    by_index = {}
    for i, d in dims:
        by_index.setdefault(i, set()).add(d)
    out = []
    for i, meta in enumerate(metas):
        symbolic = by_index.get(i)
        if symbolic:
            shape = tuple(None if d in symbolic else s for d, s in enumerate(meta[0]))
            meta = (shape,) + tuple(meta[1:])
        out.append(meta)
    return tuple(out)


def mask_key(key, dims) -> tuple:
    """`key` with its tensor sizes at `dims` symbolic."""
    return (key[0], mask_metas(key[1], dims)) + tuple(key[2:])


def exact(trace) -> bool:
    """Was `trace` compiled for exact shapes (the llvm backend: a loop for its traced trip
    count), so that serving other lengths needs a size-generic compile first?"""
    res = trace.result
    names = [res.backend] + ([res.backward.backend] if res.backward is not None else [])
    return any(get_backend(n).exact_shapes for n in names)


def same_code(a, b) -> bool:
    """Do two traces (run.Trace) run the same compiled code with the same interface?"""
    ra, rb = a.result, b.result
    if not _same_kernel(ra, rb) or (ra.backward is None) != (rb.backward is None):
        return False
    if ra.backward is not None and not _same_kernel(ra.backward, rb.backward):
        return False
    return _interface(a.tg) == _interface(b.tg)


def _same_kernel(a, b) -> bool:
    if a.kernel is b.kernel:
        return True
    pa, pb = a.program, b.program
    return program_key(pa) == program_key(pb)


def _interface(tg) -> tuple:
    sources = tuple((s.kind, s.index, s.dtype, s.rg) + (
        () if s.kind == "arg" else (tuple(s.shape), _source_key(s)))
        for s in tg.sources)
    grad_writes = tuple((k, same) for _, k, same, _ in tg.grad_writes)
    return (sources, repr(tg.outputs), tuple(tg.guards), tuple(tg.writebacks), tg.n_results,
            tuple(tg.fresh), tuple(tg.readonly), tuple(tg.grad_results),
            tuple(tg.grad_inputs), grad_writes, tuple(tg.version_bumps),
            tuple(c.text for c in tg.checks), repr(tg.spent), tg.result_spec,
            tuple((k, tuple(shape), str(dt), p) for k, shape, dt, p in tg.randoms))


def _source_key(s) -> tuple:
    """The objects an input is read from, by identity."""
    if s.kind == "captured":
        return (id(s.ref()),)
    if s.kind == "hyper":
        group, key, index = s.ref
        return (id(group()), key, index)
    if s.kind == "random":
        return (s.index, s.ref[0], str(s.ref[2]), s.ref[3])  # (the shape is the source's)
    owner, seen = s.ref  # ("grad": the owner's TensorRef, and the tensor it held)
    return (owner.index, id(owner.ref()) if owner.ref is not None else None,
            id(seen()) if seen is not None else None)


def least_sizes(trace, dims) -> tuple:
    """(flat index, dim, least size) for each symbolic dim: the size below which some loop
    of the trace's forward or backward would have no step (its trip count falls one for
    one with the length; calls below it run eagerly)."""
    graphs = [trace.result.optimized]
    if trace.result.backward is not None:
        graphs.append(trace.result.backward.split.backward)
    trips = [t for g in graphs for t in loop_trips(g)]
    fewest = min(trips, default=1)
    shapes = {s.index: s.shape for s in trace.tg.sources if s.kind == "arg"}
    return tuple((i, d, shapes[i][d] - fewest + 1) for i, d in sorted(dims) if i in shapes)


def symbolic_result(results, tgs, ns):
    """A CompileResult running one llvm kernel for every length (and one for the
    backward), from the CompileResults of one function traced at the three lengths `ns`
    (each compiled exactly by llvm, with the same interface); raises LoweringError when
    they make none (runtime.pipeline.symbolic_kernel)."""
    if any(r.backend != "llvm" or r.backward is not None and r.backward.backend != "llvm"
           for r in results) or len({r.backward is None for r in results}) != 1:
        raise LoweringError("a trace at one of the lengths was not compiled by llvm")
    if any(_interface(tg) != _interface(tgs[0]) for tg in tgs[1:]):
        raise LoweringError("the traces' inputs, outputs or guards differ between lengths")
    base = results[0]
    res = copy.copy(base)
    res.kernel, res.program = symbolic_kernel([r.optimized for r in results], ns)
    res.executable = _with_kernel(base.executable, res.kernel)
    res.reused, res.fallback = False, None
    if base.backward is not None:
        bwd = res.backward = copy.copy(base.backward)
        bwd.kernel, bwd.program = symbolic_kernel(
            [r.backward.split.backward for r in results], ns)
        bwd.executable = _with_kernel(base.backward.executable, bwd.kernel)
        bwd.reused, bwd.fallback = False, None
    # (the lengths every kernel serves, checked before the forward runs, so that a
    # backward never refuses its call; the programs are shared: not changed here)
    programs = [res.program] + ([res.backward.program] if base.backward is not None else [])
    tops = [p.max_n for p in programs if p.max_n is not None]
    res.lengths = (max(p.min_n for p in programs), min(tops) if tops else None)
    res.traced_at = sorted(ns)
    res.graphs = [[r.optimized for r in results]] + (
        [[r.backward.split.backward for r in results]] if base.backward is not None else [])
    return res


TRUST = 4  # probes confirmed on one side of a Hull before lengths beyond it are served


class Hull:
    """The lengths of symbolic dim `d` of flat argument `i` that a specialization's
    kernels for every length were confirmed for: from the least to the largest length
    traced (at first, the three `ns` they were made from, traced as `tgs`). Their graphs
    agreeing at three lengths does not tell `range(n)` from `range(min(n, 20))` traced at
    9, 13 and 20, nor `hs[:-1]` from `hs[:min(n, 20) - 1]`: so a call of a length outside
    is a probe, traced (it runs eagerly) and compared with them (`confirms`). Confirmed,
    the hull grows to it; refuted, that length and those beyond it run eagerly (`below`,
    `above`). After TRUST probes confirmed on one side, and none refuted there, the
    lengths beyond that side are served unprobed (a cap further out than every length
    probed goes unseen)."""

    def __init__(self, i, d, ns, tgs, graphs):
        self.i, self.d = i, d
        self.lo, self.hi = min(ns), max(ns)
        self.below = self.above = None  # (refuted lengths: those at or beyond run eagerly)
        self.ns, self.tgs, self.graphs = list(ns), tgs, graphs
        self.interface = _interface(tgs[0])
        self.forwards = None  # (the traces' graphs rerolled and optimized, once probed)
        self.confirmed = [0, 0]  # (probes confirmed below lo, above hi)

    def check(self, flat, exe):
        """None when the call's length is inside (or on a trusted side); else a PROBE
        Outcome, or SIDE_EXIT (with `exe.last_exit` saying why) at or beyond a length a
        probe refuted."""
        n = flat[self.i]._data.shape[self.d]
        if self.lo <= n <= self.hi:
            return None
        side = int(n > self.hi)
        wall = (self.below, self.above)[side]
        if wall is None or (n > wall if side == 0 else n < wall):
            # (a side with a refuted length is never trusted: its cap lies before it)
            return None if self.confirmed[side] >= TRUST and wall is None else \
                Outcome(Outcome.PROBE, self)
        exe.last_exit = ("error", "ValueError", f"hn-loop: size {n} of tensor argument "
                         f"{self.i} is beyond the lengths {self.lo}..{self.hi} its kernels "
                         "were confirmed for")
        return SIDE_EXIT

    def settle(self, n, why) -> None:
        """Take the verdict of the probe at length n: `why` None (confirmed), else refuted."""
        if why is None:
            self.confirmed[int(n > self.hi)] += 1
            self.lo, self.hi = min(self.lo, n), max(self.hi, n)
        elif n > self.hi:
            self.above = n if self.above is None else min(self.above, n)
        else:
            self.below = n if self.below is None else max(self.below, n)
        if all(c >= TRUST and wall is None or wall == edge for c, wall, edge in zip(
                self.confirmed, (self.below, self.above), (self.lo - 1, self.hi + 1))):
            self.tgs = self.graphs = self.forwards = None  # (no probe is left to compare)

    def confirms(self, tg, n, compiled):
        """None when `tg` (traced at length n) makes the graphs the kernels' traces predict
        at n (compiler.lowering.llvm_sym.Bounds.walk over all of them); else why not.
        What Python computed from the length is in the traced graph itself, rerolled and
        optimized; only when those of the kernels' own traces do not agree (reroll chose
        otherwise at one length) are the compiled graphs compared, `compiled()` giving
        the probe's CompileResult."""
        if _interface(tg) != self.interface:
            return "its inputs, outputs or guards differ"
        if self.forwards is None:
            self.forwards = [_rerolled(t) for t in self.tgs]
            if _disagree([self.forwards], self.ns):
                self.forwards = False
        if self.forwards:
            return _disagree([self.forwards + [_rerolled(tg)]], self.ns + [n])
        if self.graphs is None:  # (numba's size-generic code: no graphs to compare)
            return "its traces' graphs differ between lengths"
        result = compiled()
        graphs = [result.optimized] + ([result.backward.split.backward]
                                       if result.backward is not None else [])
        if len(graphs) != len(self.graphs):
            return "its results carry gradients where the others' did not"
        return _disagree([known + [g] for known, g in zip(self.graphs, graphs)],
                         self.ns + [n])


def _rerolled(tg):
    """`tg`'s graph rerolled and optimized, with a detach after each value recorded
    under no_grad that would otherwise carry a gradient (compiler.loop_grad.
    with_detaches), so that graphs compared here differ where their gradients would (a
    no_grad block that depends on the length)."""
    wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
    return optimize(reroll(with_detaches(tg.graph, wrt, tg.blocked))[0])[0]


def _disagree(families, ns):
    """Why the graphs of some family (one per length of `ns`) are not one graph but for
    sizes affine in the length, or None."""
    for graphs in families:
        try:
            Bounds().walk(graphs, ns)
        except SymbolicError as exc:
            return str(exc)
    return None


def _with_kernel(exe, kernel):
    """An Executable like `exe` running `kernel`."""
    return Executable(kernel, exe.n_outputs, exe.guards, exe.writebacks, exe.scalar_inputs,
                      exe.scalar_outputs, exe.copies)
