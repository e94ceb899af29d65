"""Capture for the tracing JIT: run a function eagerly while recording its graph.

A `TraceRecorder` is an `hn.record()` block that also notes what the graph
alone cannot say: tensors created during the call (literal constants, or values
computed outside the op set), value-dependent decisions (`bool(t)`, `t.item()`,
...) with the value seen, tensors updated in place, and anything that makes the
call impossible to replay (`t.numpy()`, random numbers, ...).
"""

from ._state import STATE, TraceHooks
from .autograd import Recorder, no_grad
from .dispatch import apply, node_of


class ValueGuard:
    """A value-dependent decision: `kind` ('bool', 'item', ...) on `node` saw `value`."""

    __slots__ = ("node", "kind", "value")

    def __init__(self, node, kind, value):
        self.node, self.kind, self.value = node, kind, value

    def __repr__(self) -> str:
        return f"ValueGuard({self.kind}({self.node.op} {self.node.type_str()}) == {self.value!r})"


class TraceRecorder(Recorder, TraceHooks):
    """Records one eager call of a traced function (see module docstring).

    While its block runs it is `STATE.tracer`: the hook table the layers below report
    to (`hybridnet._state.TraceHooks`)."""

    def __init__(self):
        super().__init__()
        self.created = {}  # id(tensor) -> tensor, for tensors built during the call
        # id -> the value a created tensor had when it was built from literals (a copy: an
        # in-place op later in the call writes into the tensor's own buffer)
        self.literals = {}
        self.guards = []
        self.reasons = []
        self.mutated = []  # tensors rebound by in-place ops, in order
        # id(tensor) -> [tensor, first event was a read?, value first read, written?, last
        # value written]: what the call assumed about and did to `.grad`
        self.grads = {}
        self.hypers = {}  # id(tensor) -> (param group, key, index): runtime scalar inputs
        self.item_reads = {}  # (id(dict), key) -> (dict, key, value): settings read
        self.attr_reads = {}  # (id(obj), name) -> (obj, name, value): containers read
        self.optimizers = {}  # id -> optimizer whose step ran (guarded by its version)
        self.versions = None  # (module structure, optimizer writes) counters at entry
        self._outer = None  # the tracer this one hides while it runs
        self.clamps = set()  # sizes of dims a view's bounds were decided from (note_clamp)
        self.randoms = {}  # id(tensor) -> (draw number, recipe, tensor): note_random

    # -- hooks called from the tensor layer -------------------------------------------

    def note_created(self, t):
        self.created[id(t)] = t

    def note_random(self, t, recipe):
        """A random draw (creation.random_tensor): the i-th of the call, drawn again by
        every compiled call, in order."""
        self.randoms[id(t)] = (len(self.randoms), recipe, t)

    def note_clamp(self, size):
        self.clamps.add(int(size))

    def note_literal(self, t):
        self.created[id(t)] = t
        self.literals[id(t)] = t._data.copy()

    def is_literal(self, t) -> bool:
        return id(t) in self.literals

    def untraceable(self, reason: str):
        if reason not in self.reasons:
            self.reasons.append(reason)

    def guard(self, t, kind: str, value):
        self.guards.append(ValueGuard(node_of(t), kind, value))

    def note_grad(self, t, value, write):
        entry = self.grads.get(id(t))
        if entry is None:
            entry = self.grads[id(t)] = [t, not write, value, False, None]
        if write:
            entry[3], entry[4] = True, value

    def note_hyper(self, t, group, key, index):
        self.hypers[id(t)] = (group, key, index)
        self.created[id(t)] = t

    def note_optimizer(self, opt):
        self.optimizers[id(opt)] = opt

    def note_item(self, mapping, key, value):
        self.item_reads.setdefault((id(mapping), key), (mapping, key, value))

    def note_attr(self, obj, name, value):
        self.attr_reads.setdefault((id(obj), name), (obj, name, value))

    def rebind(self, tensor, previous):
        super().rebind(tensor, previous)
        self.mutated.append(tensor)

    def accumulate_grad(self, leaf, g):
        """backward() inside the call: `leaf.grad` accumulates `g` through ops this trace
        records and `.grad` accesses it notes (eager does the same with raw NumPy)."""
        with no_grad():
            old = leaf.grad
            if old is None:  # (a cast copies, and compiles to nothing: the kernel's
                # outputs are fresh arrays already)
                leaf.grad = apply("cast", (g,), {"dtype": str(leaf._data.dtype)})
            elif old._rg or old.shape != g.shape:
                leaf.grad = old + g
            else:
                old.add_(g)

    # -- context ---------------------------------------------------------------------------

    def __enter__(self):
        super().__enter__()
        self._outer, STATE.tracer = STATE.tracer, self
        for install, _ in TRACE_HOOKS:
            install()
        self.versions = tuple(counter[0] for counter in VERSION_COUNTERS)
        return self

    def state_changed(self) -> bool:
        """Did the call change module structure or optimizer state/settings (which a
        compiled replay would not redo)?"""
        return self.versions != tuple(counter[0] for counter in VERSION_COUNTERS)

    def __exit__(self, *exc):
        STATE.tracer, self._outer = self._outer, None
        for _, remove in TRACE_HOOKS:
            remove()
        return super().__exit__(*exc)


# Filled by the layers above: (install, remove) pairs run around every traced call (they
# turn on the recording of Python-level reads), and process-wide [int] counters bumped by
# structural changes of modules and optimizers.
TRACE_HOOKS = []
VERSION_COUNTERS = []


def active():
    """The innermost TraceRecorder, or None."""
    return STATE.tracer
