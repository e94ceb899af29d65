"""Run a compiled trace: call the kernel, check value guards, write back updates.

The runtime sees arrays only. `Executable.run` returns the output arrays, or the
`SIDE_EXIT` outcome when a value guard computed inside the compiled code differs
from the value seen while tracing; nothing has been written back then, so the
caller may rerun eagerly. Outcomes are values (`Outcome`), never an in-band None.
"""

import math

import numpy as np

from compiler.errors import describe


class Outcome:
    """What running a compiled trace gave: `kind` is one of RESULT, SIDE_EXIT, STALE
    (a guard on state failed: trace again), ALIASED (an in-place update would write
    memory another input shares), FAILED (the backend rejected the code; `value` says
    why), PROBE (a length its kernels were not confirmed for: trace it to confirm them,
    `value` the hybridnet.jit.dynamic.Hull); for RESULT `value` is the result."""

    __slots__ = ("kind", "value")
    RESULT, SIDE_EXIT, STALE, ALIASED, FAILED, PROBE = "result", "side_exit", "stale", \
        "aliased", "failed", "probe"

    def __init__(self, kind: str, value=None):
        self.kind, self.value = kind, value

    def __repr__(self) -> str:
        return f"Outcome({self.kind}{'' if self.value is None else ', ...'})"


SIDE_EXIT = Outcome(Outcome.SIDE_EXIT)
STALE = Outcome(Outcome.STALE)
ALIASED = Outcome(Outcome.ALIASED)


class Executable:
    """One compiled specialization of a traced function."""

    def __init__(self, kernel, n_outputs: int, guards, writebacks, scalar_inputs,
                 scalar_outputs=(), copies=()):
        self.kernel = kernel
        self.n_outputs = n_outputs  # user-visible outputs come first
        self.guards = list(guards)  # (output index, kind, expected value)
        self.writebacks = list(writebacks)  # (output index, target index in arrays)
        self.scalar_inputs = tuple(scalar_inputs)  # positions of 0-d inputs
        self.scalar_outputs = frozenset(scalar_outputs)  # positions of 0-d outputs
        # outputs the kernel may alias to an input or constant where eager gave a new array
        self.copies = tuple(copies)
        self.calls = 0
        self.side_exits = 0
        self.last_exit = None  # (kind, value seen while tracing, value now) of the last exit
        # No guards, write-backs or 0-d values: the kernel's tuple is the answer.
        self.plain = not (self.guards or self.writebacks or self.scalar_inputs or
                          self.scalar_outputs or self.copies or
                          getattr(kernel.program, "may_exit", False))
        self.single = bool(getattr(kernel.program, "single_output", False))

    def prepare(self, arrays):
        """0-d inputs travel as 1-element 1-d arrays (what the generated code indexes)."""
        if not self.scalar_inputs:
            return arrays
        arrays = list(arrays)
        for i in self.scalar_inputs:
            arrays[i] = arrays[i].reshape(1)
        return arrays

    def _error_note(self, arrays) -> str:
        """Added to a kernel failure (its type kept): the kernel and its inputs."""
        name = getattr(self.kernel, "filename", type(self.kernel).__name__)
        inputs = describe([a.shape for a in arrays], [a.dtype for a in arrays])
        return f"while running compiled kernel {name} on inputs ({inputs})"

    def run(self, arrays):
        """The output arrays (user-visible ones first), or SIDE_EXIT."""
        self.calls += 1
        if self.plain and self.kernel.compiled:
            return (self.kernel.fn(*arrays),) if self.single else self.kernel.fn(*arrays)
        try:
            outs = self.kernel(*self.prepare(arrays))
        except Exception as exc:
            if type(exc).__module__.startswith("numba."):
                raise  # (the caller turns a backend rejection into an eager fallback)
            if self.guards or str(exc).startswith("hn-loop"):
                # a value guard's path eager would not take, or sizes that give a loop no
                # trip count (compiler.lowering.loop_rule): nothing was written yet
                self.side_exits += 1
                self.last_exit = ("error", type(exc).__name__, str(exc)[:100])
                return SIDE_EXIT
            exc.add_note(self._error_note(arrays))
            raise
        if self.single:
            outs = (outs,)
        for index, kind, expected in self.guards:
            if not guard_holds(outs[index], kind, expected):
                self.side_exits += 1
                self.last_exit = (kind, expected, outs[index].reshape(-1)[0].item())
                return SIDE_EXIT
        if self.copies:  # before the write-backs, which may update an aliased input
            outs = list(outs)
            for k in self.copies:
                outs[k] = outs[k].copy()
        for index, target in self.writebacks:
            dest = arrays[target]
            np.copyto(dest, outs[index].reshape(dest.shape))
        scalars = self.scalar_outputs
        return [o.reshape(()) if i in scalars else o for i, o in enumerate(outs)]


def guard_holds(arr, kind, expected) -> bool:
    """Does the value guarded (`arr`'s one element) still equal what the trace saw?"""
    value = arr.reshape(-1)[0].item()
    if kind == "bool":
        return bool(value) == expected
    if isinstance(expected, float):
        if expected != expected:
            return value != value
        if expected == 0.0:  # -0.0 and 0.0 are different values to what follows
            return value == 0.0 and math.copysign(1.0, value) == math.copysign(1.0, expected)
    return value == expected
