"""Process-wide state at the bottom of the user layer: grad mode, the active
`hn.record()` blocks, and the hook table through which a trace being recorded hears
from the layers below it.

Like PyTorch's grad mode this is a global switch; hybridnet is not thread-safe
for concurrent grad-mode changes.

The hook table: `STATE.tracer` is None, or the innermost `TraceRecorder` (in
`hybridnet.capture`, near the top of the layer), which implements `TraceHooks`.
Low-level code (the tensor type, dispatch, factories, indexing) tells it what the
graph alone cannot say by calling these methods, guarded by one `is not None` test,
and never imports capture: the recorder registers itself here when its block starts.
"""


class TraceHooks:
    """What the tensor layer reports to a trace being recorded (no-ops here)."""

    def note_created(self, t) -> None:
        """`t` was built from an array made outside the op set during the call."""

    def note_literal(self, t) -> None:
        """`t` was built from literals only (a constant the trace may bake in)."""

    def is_literal(self, t) -> bool:
        """Was `t` noted as a literal during this call?"""
        return False

    def untraceable(self, reason: str) -> None:
        """The call does something a replay cannot do: it runs eagerly, for `reason`."""

    def guard(self, t, kind: str, value) -> None:
        """A value-dependent decision: `kind` ('bool', 'item', ...) read `value` from t."""

    def note_grad(self, t, value, write: bool) -> None:
        """`t.grad` was read (or, with `write`, assigned) as `value`."""

    def note_clamp(self, size: int) -> None:
        """A view's bounds were decided from a dim of `size` (a slice bound outside it
        clamped, `x[:20]` of 10 rows; split or chunk pieces): traces whose such sizes
        differ never share one specialization of symbolic lengths."""


class _State:
    __slots__ = ("grad", "recorders", "tracer")

    def __init__(self):
        self.grad = True
        self.recorders = []
        self.tracer = None


STATE = _State()


def note_untraceable(reason: str) -> None:
    """Mark the call being traced (if any) as impossible to replay, with the reason."""
    tracer = STATE.tracer
    if tracer is not None:
        tracer.untraceable(reason)


def note_value(t, kind: str, value) -> None:
    """Record a guard on a value read from `t` (if a trace is being recorded)."""
    tracer = STATE.tracer
    if tracer is not None:
        tracer.guard(t, kind, value)


def note_clamp(size: int) -> None:
    """Record that a view's bounds were decided from a dim of `size` (TraceHooks.
    note_clamp), if a trace is being recorded."""
    tracer = STATE.tracer
    if tracer is not None:
        tracer.note_clamp(size)

# While a call is recorded: id(alias) -> (weakref(alias), weakref(base)) for each tensor
# `base.data` gave. An in-place update of such an alias is an update of its base
# (hybridnet.inplace), as in PyTorch, where `p.data.add_(...)` changes p.
DATA_ALIASES = {}
