"""Generalizing: specializations of one traced function that differ only in the lengths
their loops iterate over merge into one whose lengths are symbolic (dynamic.py).

With an exact-shape backend (llvm), the first EXACT_LENGTHS lengths each compile for
their own trip count; a further length of the same dim makes one llvm kernel for every
length from the three traces (dynamic.symbolic_result, compiler.lowering.llvm_sym), or,
when they make none, numba's size-generic code.
"""

import time

from .compile import LoweringError, compile_trace
from .dynamic import (
    Hull,
    differing_dims,
    exact,
    least_sizes,
    mask_key,
    same_code,
    symbolic_result,
    trip_dims,
)
from .guards import make_guard
from .keys import describe_dim, module_key
from .pytree import Unsupported, flatten
from .run import Trace

# Lengths a rerolled loop is compiled for exactly by an exact-shape backend (llvm: well
# under a second each) before a further length makes its trip count symbolic (numba's
# size-generic code: one slower compile serves every length). So a loop of a fixed
# length (an RNN over 35 steps, with one shorter last batch) never waits for numba.
EXACT_LENGTHS = 2


class Generalizing:
    """The generalization steps of hybridnet.jit.traced.TracedFunction."""

    def _generalize(self, entry, args, kwargs):
        """Merge `entry` into a specialization it differs from only in the lengths its
        loops iterate over, when both run the same code: those sizes become symbolic
        (see dynamic.py). Traces compiled for exact shapes (llvm) are merged once
        EXACT_LENGTHS other lengths were seen: into one llvm kernel for every length, else
        after compiling them size-generic with numba."""
        if len(entry.traces) != 1:
            return
        mine = entry.traces[0]
        pairs = []
        for other in list(self.specializations.values()):
            # (a view whose bounds Python decided from a size that differs between the
            # lengths, x[:20] traced at 10 and 11 rows: the kernel could not decide it)
            # (one symbolic length per specialization: its probes compare traces that
            # differ in that length only, dynamic.Hull)
            if other is entry or len(other.traces) != 1 or other.fallback is not None or \
                    other.symbolic or other.traces[0].tg.clamps != mine.tg.clamps:
                continue
            dims = differing_dims(other.key, entry.key)
            theirs = other.traces[0]
            # (one size at a time: two sizes that moved together in two calls, say a
            # loop's length and the size it slices with a fixed gap, cannot be told apart)
            if dims and len(dims) == 1 and trip_dims(
                    other.key, entry.key, dims, theirs.result, mine.result):
                pairs.append((other, dims))
        if exact(mine):
            # (not yet, unless a specialization it pairs with serves every length already;
            # fewer with a cache too small to hold EXACT_LENGTHS of them)
            wanted = min(EXACT_LENGTHS, self.cache_limit - 1)
            if len(pairs) < wanted and all(exact(o.traces[0]) for o, _ in pairs):
                return
            if self._merge_symbolic(entry, mine, pairs, args, kwargs):
                return
            exact_mine, mine = True, self._generic(mine)
            if mine is None:
                return
        else:
            exact_mine = False
        matches = [(other, dims, theirs) for other, dims in pairs
                   for theirs in [self._generic(other.traces[0])]
                   if theirs is not None and same_code(theirs, mine)]
        # (from exact traces, as three points with llvm: two other lengths with the same
        # code, so that a value Python computed from the length, n // 2 the same at 20 and
        # 21, is less likely to pass for a constant)
        if len(matches) < (2 if exact_mine and len(pairs) >= 2 else 1):
            return
        other, dims, theirs = matches[0]
        (i, d), = dims
        ns = [o.key[1][i][0][d] for o, _, _ in matches] + [entry.key[1][i][0][d]]
        hull = Hull(i, d, ns, [t.tg for _, _, t in matches] + [mine.tg], None)
        if theirs is not other.traces[0]:
            other.traces[0] = theirs
            theirs.result.reused = False  # (its kernel compiles at its first run)
            self.stats.compiles += 1
            self.stats.event("backend_fallback", theirs.result.fallback)
            self._forget_exact(other, pairs)
        self._adopt(entry, other, dims, theirs, args, kwargs)
        theirs.hull = hull

    def _forget_exact(self, other, pairs):
        """(the other exact specializations of these lengths would never be hit again: the
        symbolic guard, tried first, accepts their lengths too)"""
        for stale, _ in pairs:
            if stale is not other and exact(stale.traces[0]):
                self._forget(stale)

    def _merge_symbolic(self, entry, mine, pairs, args, kwargs) -> bool:
        """Merge `entry` and two specializations of other lengths of the same dim, all
        compiled exactly by llvm, into one llvm kernel for every length (dynamic.
        symbolic_result); False when they make none (numba's size-generic code then)."""
        same = [(o, d) for o, d in pairs if d == pairs[0][1] and exact(o.traces[0])] \
            if pairs else []
        if len(same) < 2:
            return False
        (i0, d0), = same[0][1]
        # (the two longest: a short length may trace another structure, a loop too short
        # to reroll between steps the code picks; a failed merge then waits for a longer)
        same = sorted(same, key=lambda od: -od[0].key[1][i0][0][d0])[:2]
        traces = [o.traces[0] for o, _ in same] + [mine]
        ns = [k[1][i0][0][d0] for k in [o.key for o, _ in same] + [entry.key]]
        start = time.perf_counter()
        try:
            res = symbolic_result([t.result for t in traces], [t.tg for t in traces], ns)
        except LoweringError as exc:
            self.stats.event("backend_fallback", f"llvm backend: no kernel for every length "
                             f"({exc}); numba's size-generic code instead")
            return False
        self.stats.compile_seconds += time.perf_counter() - start
        self.stats.compiles += 1
        other, dims = same[0]
        theirs = other.traces[0] = Trace(traces[0].tg, res, self.stats)
        self._forget_exact(other, pairs)
        self._adopt(entry, other, dims, theirs, args, kwargs)
        # (outside the lengths the kernels serve, a call runs eagerly before any runs)
        least, most = res.lengths
        theirs.min_sizes = tuple((i, d, max(m, least) if (i, d) == (i0, d0) else m)
                                 for i, d, m in theirs.min_sizes)
        theirs.max_sizes = () if most is None else ((i0, d0, most),)
        theirs.hull = Hull(i0, d0, ns, [t.tg for t in traces], res.graphs)
        return True

    def _probe(self, entry, hull, flat, args, kwargs):
        """A call of a length outside those `hull`'s kernels for every length were
        confirmed for: traced (so it runs eagerly) and compared with them (dynamic.Hull)."""
        n = flat[hull.i]._data.shape[hull.d]
        try:
            flat, spec = flatten((args, kwargs), module_key=module_key, packs=entry.packs)
            result, tg = self._record(flat, args, kwargs, self._key(flat, spec))
        except Unsupported as exc:
            result, tg = self.fn(*args, **kwargs), exc
        except BaseException:  # (the function raised at this length: it must again)
            hull.settle(n, "the function raised")
            raise
        if isinstance(tg, Exception):
            why = str(tg)
        else:
            try:
                why = hull.confirms(tg, n, lambda: compile_trace(tg, False, self.backend,
                                                                 lazy=True))
            except Exception as exc:  # noqa: BLE001  (no comparison: refuted, eager is right)
                why = f"{type(exc).__name__}: {exc}"
        hull.settle(n, why)
        self.stats.eager_calls += 1
        self.stats.probes += 1
        self.stats.event("probe", f"length {n} traced to confirm the kernels for every "
                         "length: " + ("confirmed" if why is None else
                                       f"refuted ({why}); it and the lengths beyond run "
                                       "eagerly"))
        return result

    def _adopt(self, entry, other, dims, theirs, args, kwargs):
        """`other` (now running `theirs`) serves the lengths of `entry` too: its sizes at
        `dims` become symbolic."""
        spec = entry.key[0]
        symbolic = other.symbolic | dims
        masks = self._symbolic.setdefault(spec, set())
        masks.discard(other.symbolic)
        masks.add(symbolic)
        self._forget(entry)
        self._forget(other)
        other.key = mask_key(other.key, symbolic)
        other.symbolic = symbolic
        theirs.min_sizes = least_sizes(theirs, symbolic)
        other.guard, other.version = make_guard(
            args, kwargs, other.key, fn=self._env_fn if self._has_env else None,
            module=self.module, same=other.key[3], bound=self._self, symbolic=symbolic,
            packs=other.packs)
        self.specializations.put(other.key, other)
        self._promote(other)
        self.stats.event("generalize", "loop trip counts made symbolic ("
                         f"{_describe_dims(symbolic, entry.key)}): one specialization serves "
                         "every length")

    def _generic(self, trace):
        """`trace` compiled size-generic (by numba: lowered now, compiled at its first
        run), or None if that fails; made once per trace."""
        if not exact(trace):
            return trace
        if not hasattr(trace, "generic"):
            try:
                res = compile_trace(trace.tg, self.dynamic, "numba")
                res.fallback = ("its loops serve every length now (symbolic trip counts), "
                                "which needs numba's size-generic code: compiled by numba")
                trace.generic = Trace(trace.tg, res, self.stats)
            except LoweringError:
                trace.generic = None
        return trace.generic


def _describe_dims(dims, key) -> str:
    return ", ".join(describe_dim(key[1], i, d) for i, d in sorted(dims))
