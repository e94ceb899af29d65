"""Running one compiled trace on a call's flat tensors: an `Outcome`, never an in-band None.

`Trace.run(flat)` gathers the kernel's input arrays from their sources (arguments,
captured tensors, `.grad`s, optimizer settings), checks what the trace read
(`reads.Check`), runs the kernel, checks its value guards, writes in-place updates
back, replays `.grad` assignments, and returns RESULT with the result in the
structure eager returned (arguments and outside tensors it returned as the very
same objects), or SIDE_EXIT, STALE, ALIASED or FAILED.
"""

import numpy as np

from compiler.ops import REGISTRY
from runtime.executor import ALIASED, SIDE_EXIT, STALE, Outcome

from ..creation import draw, rng_state, set_rng_state
from ..dispatch import TapeNode
from ..tensor import make, share_version, version_counter, wrap
from .call_node import CallRecord
from .pytree import Packed, unflatten

_NUMBER = (int, float)


class Trace:
    """One compiled path of a specialization."""

    def __init__(self, tg, result, stats):
        self.tg = tg
        self.result = result
        self.stats = stats
        self._targets = frozenset(t for _, t in tg.writebacks)
        self.min_sizes = ()  # (flat index, dim, least size) once its lengths are symbolic
        self.max_sizes = ()  # (flat index, dim, largest size) its kernels serve
        self.hull = None  # (dynamic.Hull: the lengths its symbolic kernels were confirmed for)
        self._simple = all(s.kind == "arg" for s in tg.sources) and not tg.checks and \
            not tg.randoms  # (a draw nothing uses must still move the generator)
        self._arg_index = [s.index for s in tg.sources]
        self._single = tg.result_spec == ("T",) and tg.outputs == [("out", 0)] and \
            not tg.grad_writes and not tg.readonly[0] and not tg.versions[0] and \
            not tg.spent[0] and not tg.grad_results
        bwd = result.backward
        self._call = CallRecord(tg, bwd, stats) if bwd is not None else None

    def gather(self, flat):
        """The kernel's input arrays, or None when a source no longer matches the trace."""
        if self._simple:
            return [flat[i]._data for i in self._arg_index]
        arrays = []
        for src in self.tg.sources:
            if src.kind == "arg":
                arrays.append(flat[src.index]._data)
                continue
            arr = None if src.kind == "random" else _source_array(src, flat)
            if arr is None and src.kind != "random":
                return None
            arrays.append(arr)
        for check in self.tg.checks:
            if not check.holds(flat):
                return None
        if self.tg.randoms:  # every draw of the call, in order, once nothing can fail
            self._rng = rng_state()
            drawn = [draw(recipe) for recipe in self.tg.randoms]
            for k, src in enumerate(self.tg.sources):
                if src.kind == "random":
                    arrays[k] = drawn[src.index]
            self._arrays = arrays  # (a result may view a draw: _source_tensor)
        return arrays

    def failed_check(self, flat) -> str:
        """What no longer matches (for the event log), after gather() said None."""
        for src in self.tg.sources:
            if src.kind not in ("arg", "random") and _source_array(src, flat) is None:
                return f"a {src.kind} input ({src.dtype}{list(src.shape)}) changed"
        for check in self.tg.checks:
            if not check.holds(flat):
                return f"guard failed: {check.text}"
        return "a guard failed"

    def run(self, flat) -> Outcome:
        """Run on the call's flat tensors (see the module docstring)."""
        general = self._run_drawing if self.tg.randoms else self._run
        out = general(flat)
        if out.kind is Outcome.RESULT and self.result.kernel.compiled:
            # compiled now: from the next call on, the short path or the general one
            self.run = self._fast_runner() or general
        return out

    def _run_drawing(self, flat) -> Outcome:
        """_run for a trace that draws random numbers: when the call does not finish
        compiled, the generator goes back to where it was (the eager rerun draws what
        eager draws)."""
        self._rng = None
        out = self._run(flat)
        if self._rng is not None and out.kind != Outcome.RESULT:
            set_rng_state(self._rng)
        return out

    def _fast_runner(self):
        """For a plain trace (arguments in, one fresh tensor out, nothing to check or write
        back) once its kernel is compiled: gather, call, wrap."""
        exe = self.result.executable
        if not (self._simple and self._single and exe.plain and exe.single and
                not self.tg.version_bumps and self.hull is None):
            return None
        fn, index, stats = self.result.kernel.fn, self._arg_index, self.stats
        result = Outcome.RESULT

        def run(flat):
            out = fn(*[flat[i]._data for i in index])
            stats.compiled_calls += 1
            return Outcome(result, wrap(out))
        return run

    def _run(self, flat) -> Outcome:
        for i, d, least in self.min_sizes:  # (symbolic lengths: dynamic.py)
            if flat[i]._data.shape[d] < least:
                self.result.executable.last_exit = (
                    "error", "ValueError", f"hn-loop: size {flat[i]._data.shape[d]} of "
                    f"tensor argument {i} is below the {least} its loops need")
                return SIDE_EXIT
        for i, d, most in self.max_sizes:
            if flat[i]._data.shape[d] > most:
                self.result.executable.last_exit = (
                    "error", "ValueError", f"hn-loop: size {flat[i]._data.shape[d]} of "
                    f"tensor argument {i} is above the {most} its kernels serve")
                return SIDE_EXIT
        if self.hull is not None:
            out = self.hull.check(flat, self.result.executable)
            if out is not None:
                return out
        arrays = self.gather(flat)
        if arrays is None:
            return STALE
        if self._targets and (_overlaps(arrays, self._targets) or
                              _overlaps_items(arrays, self._targets, flat)):
            return ALIASED
        exe, kernel = self.result.executable, self.result.kernel
        first = not kernel.compiled
        try:
            outs = exe.run(arrays)
        except Exception as exc:  # only Numba's own errors are caught
            if not type(exc).__module__.startswith("numba."):
                raise
            text = str(exc).strip()
            first_line = text.splitlines()[0] if text else ""
            return Outcome(Outcome.FAILED, f"the numba backend could not compile this trace "
                           f"({type(exc).__name__}: {first_line[:200]})")
        if first:
            self.stats.compile_seconds += kernel.compile_seconds + self.result.seconds
            self.stats.compiles += bool(getattr(kernel, "deferred", False))
            if getattr(kernel, "fallback", None):  # (lowered now: runtime.pipeline)
                self.stats.event("backend_fallback", kernel.fallback)
        if outs is SIDE_EXIT:
            return SIDE_EXIT
        self.stats.compiled_calls += 1
        for pos, count in self.tg.version_bumps:  # as eager's in-place ops bumped them
            version_counter(self._source_tensor(pos, flat))[0] += count
        if self._single:
            return Outcome(Outcome.RESULT, self._fresh(outs, 0))
        leaves = []
        for out in self.tg.outputs:
            kind, i = out[0], out[1]
            leaves.append(self._fresh(outs, i) if kind == "out" else flat[i] if kind == "arg"
                          else leaves[i] if kind == "same" else self._view(out, leaves, flat)
                          if kind == "view" else self._source_tensor(i, flat))
        if self._call is not None:
            inputs = [None if s.kind in ("hyper", "random") else self._source_tensor(p, flat)
                      for p, s in enumerate(self.tg.sources)]
            leaves = self._call.attach(leaves, inputs, arrays, outs)
        for tref, k, same, version in self.tg.grad_writes:
            owner = tref.resolve(flat)
            if k is None:
                owner._grad = None
            elif same is not None:
                owner._grad = leaves[same]
            else:
                # (an array of its own: the executable copied it if the kernel's could be
                # shared, compile._aliased_results)
                g = wrap(outs[k].reshape(owner._data.shape))
                if version:
                    g._vc = [version]
                owner._grad = g
        return Outcome(Outcome.RESULT, unflatten(self.tg.result_spec, leaves))

    def _view(self, out, leaves, flat):
        """A result that eager returned as a view: the same ops on the same base."""
        (where, i), chain = out[1], out[2]
        base = self._source_tensor(i, flat) if where == "input" else leaves[i]
        arr = base._data
        for op, attrs in chain:
            arr = REGISTRY[op].impl(arr, **attrs)
        return share_version(wrap(arr), base)

    def _fresh(self, outs, k):
        spent = self.tg.spent[k] if self.tg.spent else None
        t = wrap(outs[k]) if spent is None else _spent_result(outs[k], spent)
        if self.tg.readonly[k]:  # eager gave a read-only view (expand): so does this
            t._data.flags.writeable = False
        if self.tg.versions[k]:  # made and updated in place inside the call
            t._vc = [self.tg.versions[k]]
        return t

    def _source_tensor(self, pos, flat):
        """The tensor behind input `pos` (an argument, captured or a .grad)."""
        src = self.tg.sources[pos]
        if src.kind == "arg":
            return flat[src.index]
        if src.kind == "random":  # this call's draw (a result views it, or it was updated)
            return wrap(self._arrays[pos])
        return src.ref() if src.kind == "captured" else src.ref[0].resolve(flat)._grad


def _spent_result(arr, spent):
    """A result whose autograd graph the call's own backward() freed, as eager leaves it:
    requires_grad, a grad_fn, and a second backward() raises."""
    op, shape, dtype = spent
    node = TapeNode(op, (), {}, shape, dtype, True)
    node.value, node.saved, node.ref = None, (), None
    return make(arr, True, node)


def _source_array(src, flat):
    """The array for a non-argument source now, or None if it no longer matches."""
    if src.kind == "hyper":
        group_ref, key, index = src.ref
        group = group_ref()
        value = None if group is None else dict.get(group, key)
        if index is not None:
            value = value[index] if type(value) is tuple and len(value) > index else None
        if type(value) not in _NUMBER:
            return None
        return np.array(value, dtype=np.float64)
    if src.kind == "captured":
        t = src.ref()
    else:  # "grad": the owner's .grad, unless the tensor seen while tracing is alive and
        # is no longer that grad (then the function may reach it another way)
        owner_ref, seen_ref = src.ref
        owner = owner_ref.resolve(flat)
        t = None if owner is None else owner._grad
        seen = None if seen_ref is None else seen_ref()
        if seen is not None and seen is not t:
            return None
    if t is None or t._data.shape != src.shape or t._data.dtype != src.dtype or \
            t._rg is not src.rg:
        return None
    return t._data


def _overlaps_items(arrays, targets, flat) -> bool:
    """Does an array updated in place share memory with an item of a packed list (whose
    stacked copy is what the kernel reads)?"""
    items = [t._data for p in flat if isinstance(p, Packed) for t in p.items]
    return bool(items) and any(np.may_share_memory(arrays[i], a)
                               for i in targets for a in items)


def _overlaps(arrays, targets) -> bool:
    """Does an array updated in place share memory with another input of this call? (The
    graph gives each input its own buffer; eager code would see the update through it.)"""
    by_root = {}
    for i, a in enumerate(arrays):
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        by_root.setdefault(id(root), []).append(i)
    for group in by_root.values():
        if len(group) > 1 and not targets.isdisjoint(group):
            for i in targets.intersection(group):
                if any(j != i and np.may_share_memory(arrays[i], arrays[j]) for j in group):
                    return True
    return False
