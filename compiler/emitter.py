"""The op emitter interface vjp rules are written against, and the emitter that builds
graph nodes (symbolic backward).

A vjp rule calls `e(name, *values, **attrs)`, `e.const(value, like)` and `e.dtype(v)`.
`Emitter` holds what every emitter shares: the scalar-typing rule (a Python scalar
operand takes the dtype of the first non-bool value among the operands, or of the
first value when all are bool). Subclasses say what a value is (`value_type`), how an op
is applied to values of one dtype (`op`), and how constants are made. The eager
emitter (`hybridnet.dispatch.EagerEmitter`) applies ops to tensors; `GraphEmitter`
builds `Node`s, so the same rules give a backward graph.
"""

import numpy as np

from .ir import Node
from .registry import REGISTRY


class Emitter:
    """Base emitter: `e(name, *values, **attrs)` with Python scalars typed."""

    value_type = object  # the type of this emitter's values (not Python/NumPy scalars)
    # True: the engine may hand gradient contributions to `accumulate` and `add_window`,
    # which sum them into buffers the emitter owns (eager backward with no history)
    in_place = False

    def __call__(self, name, *vals, **attrs):
        T = self.value_type
        if all(isinstance(v, T) for v in vals):
            return self.op(name, vals, attrs)
        values = [v for v in vals if isinstance(v, T)]
        like = next((v for v in values if self.dtype(v).kind != "b"), values[0])
        dt = self.dtype(like)
        return self.op(name, [v if isinstance(v, T) else dt.type(v) for v in vals], attrs)

    def op(self, name, vals, attrs):
        """Apply op `name` to `vals` (values, or NumPy scalars already typed)."""
        raise NotImplementedError

    def accumulate(self, old, g):
        """old + g: two gradient contributions to one value (pending sums)."""
        return self("add", old, g)

    def add_window(self, old, g, shape, index):
        """old (None: zeros of `shape`) plus `g` written into the window `index` (the
        (start, stop, step) per dim of a `window == "read"` op): only for `in_place`
        emitters; the engine runs the read op's vjp for the others."""
        raise NotImplementedError

    def settle(self, pending):
        """The value a pending gradient stands for (an `in_place` emitter's buffer)."""
        return pending

    def const(self, value, like):
        """A 0-d constant with `like`'s dtype."""
        raise NotImplementedError

    def dtype(self, v) -> np.dtype:
        """The NumPy dtype of a value."""
        raise NotImplementedError


class GraphEmitter(Emitter):
    """Builds graph nodes: the values are `Node`s, shapes and dtypes come from each op's
    rule (so a rule that does not type-check fails here, naming the op)."""

    value_type = Node

    def op(self, name, vals, attrs):
        inputs = tuple(v if isinstance(v, Node) else self._scalar(v) for v in vals)
        shape, dtype = REGISTRY[name].check([i.shape for i in inputs],
                                            [i.dtype for i in inputs], attrs)
        return Node(name, inputs, dict(attrs), tuple(shape), dtype)

    def _scalar(self, v) -> Node:
        arr = np.asarray(v)
        return Node("const", (), {"value": arr.item(), "dtype": str(arr.dtype)}, (), arr.dtype)

    def const(self, value, like):
        return self._scalar(like.dtype.type(value))

    def dtype(self, v) -> np.dtype:
        return v.dtype
