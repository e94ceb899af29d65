"""Autograd for compiled calls: the results of a traced call that need gradients carry
one `CallNode`, whose backward runs the compiled backward kernel.

Each differentiable result gets a `CallOutput` node (its `grad_fn`), whose only input is
the call's `CallNode`; the call node's inputs are the tape nodes of the call's tensors
that require grad (leaves, or outside history when the call is one piece of a larger
eager graph). The engine (`compiler.autodiff.backward`) gathers the gradients of every
output of one call before it reaches the call node (a topological walk), then runs its
backward once with zeros for the outputs nothing used, and routes the gradients to the
inputs, where eager accumulation into `.grad` takes over. `retain_graph=False` frees the
saved values as it frees any node's.

With `create_graph=True` the call's graph runs eagerly instead (the forward again from the
inputs, then its vjps with history), so higher-order gradients are eager's own; the call
counts it as a fallback with that reason.
"""

import numpy as np

from compiler.autodiff import OwnBackward, SlotsBackward, outputs_read_by_vjps
from compiler.autodiff import backward as engine_backward
from compiler.errors import OpError
from compiler.registry import OpDef, Trait
from runtime.executor import SIDE_EXIT

from .._state import STATE
from ..autograd import no_grad
from ..dispatch import EMIT, TapeNode, apply, node_of
from ..tensor import Tensor, make, version_counter, wrap


def _not_runnable(*args, **kwargs):
    raise OpError("compiled_call: the autograd node of a compiled call has no eager impl "
                  "(it only runs a backward)")


# What `node.opdef` answers for these nodes (not a registry op: nothing lowers or exports
# it); a result that is a view of an input answers as a movement, so in-place updates of it
# in grad mode raise as eager's do
CALL_OPDEF = OpDef("compiled_call", -1, _not_runnable, _not_runnable, vjp=(), saves=frozenset())
VIEW_OPDEF = OpDef("compiled_call_output", -1, _not_runnable, _not_runnable, vjp=(),
                   saves=frozenset(), traits=frozenset({Trait.MOVEMENT}))


class CallNode(TapeNode, SlotsBackward):
    """The one autograd node of a compiled call. `value` holds the saved arrays (None
    once freed); `call`: the `CallRecord` with the compiled backward."""

    __slots__ = ("call", "replay", "done", "walked", "seed_shapes")

    def route(self, e, g, value_of):
        grads = self.call.backward(self, g, value_of)
        self.walked = set(g)
        return list(zip(self.inputs, grads))

    def release(self):
        """Freed (as backward frees what it walked) once a backward without retain_graph
        has walked every output: a later backward through another output still finds its
        saved values."""
        self.done |= self.walked
        if len(self.done) >= len(self.call.seed_shapes):
            self.value = self.replay = None

    def name(self) -> str:
        return "CompiledCallBackward"

    @property
    def opdef(self):
        return CALL_OPDEF


class CallOutput(TapeNode, OwnBackward):
    """Result `index` of a compiled call: its gradient goes to the call's slot `index`."""

    __slots__ = ("index", "view")

    def route(self, e, g, value_of):
        return [(self.inputs[0], (self.index, g))]

    def release(self):
        self.value = None

    def name(self) -> str:
        return "CompiledCallBackward"

    @property
    def opdef(self):
        return VIEW_OPDEF if self.view else CALL_OPDEF


class CallRecord:
    """What one differentiable trace needs to run its backward (shared by its calls)."""

    def __init__(self, tg, backward, stats):
        self.tg, self.bwd, self.stats = tg, backward, stats
        self.n_graph_out = len(tg.graph.outputs)
        self.seed_shapes = [(tuple(tg.graph.outputs[k].shape), tg.graph.outputs[k].dtype)
                            for k in tg.grad_results]
        self._views = [tg.outputs[k][0] == "view" for k in tg.grad_results]
        # results eager's vjps read (tanh's output, mul's operand): checked as eager's are
        self._read = outputs_read_by_vjps(tg.graph) if backward is not None else []

    def attach(self, leaves, input_tensors, arrays, outs):
        """Give the differentiable results (in `leaves`, replaced) their autograd nodes.
        `input_tensors`: per graph input, the tensor it came from; `arrays`: the kernel's
        input arrays; `outs`: its outputs, the saved values after the graph's own."""
        tg = self.tg
        call = CallNode("compiled_call", tuple([node_of(input_tensors[i])
                                                for i in tg.grad_inputs]),
                        {}, (), None, True)
        sources = self.bwd.saved_sources
        saved = call.value = tuple(outs[self.n_graph_out:]) if sources is None else \
            tuple(outs[k] if k >= 0 else arrays[-1 - k] for k in sources)
        call.ref, call.call, call.done, call.walked = None, self, set(), set()
        call.replay = (arrays, _versions(input_tensors))
        # (this call's result shapes: with symbolic lengths, not always the trace's)
        call.seed_shapes = shapes = []
        views = self._views
        for slot, k in enumerate(tg.grad_results):
            t = leaves[k]
            data = t._data
            shapes.append((data.shape, self.seed_shapes[slot][1]))
            node = CallOutput("compiled_call_output", (call,), {}, data.shape, data.dtype,
                              True)
            node.value, node.ref, node.index, node.view, node.saved = \
                data, None, slot, views[slot], ()
            out = leaves[k] = make(data, True, node)
            out._vc = t._vc  # (a view of an input shares its version counter)
        # Checked whenever any output's backward runs (modified in place before it, it
        # raises as eager does): the inputs and results eager's vjps read, and every
        # result whose buffer the compiled backward reads (a value made under no_grad)
        checked = [input_tensors[i] for i in self.bwd.saved_inputs]
        checked += [leaves[k] for k in self._read if isinstance(leaves[k], Tensor)]
        for t in leaves:
            if isinstance(t, Tensor) and _shares(t._data, saved):
                checked.append(t)
        call.saved = _versions(checked)
        return leaves

    def backward(self, node, slots, value_of):
        """Gradients for the call node's inputs, from the gradients of its outputs."""
        if STATE.grad:  # create_graph=True: eager's own higher-order graph
            return self._eager_backward(node, slots, value_of)
        seeds = []
        for slot, (shape, dtype) in enumerate(node.seed_shapes):
            g = slots.get(slot)
            seeds.append(np.zeros(shape, dtype) if g is None else
                         np.ascontiguousarray(g._data, dtype=dtype))
        kernel = self.bwd.kernel
        first = not kernel.compiled  # (Numba compiles at the first run)
        outs = self.bwd.executable.run(list(node.value) + seeds)
        if outs is SIDE_EXIT:  # (a loop found no trip count: never expected)
            raise RuntimeError("the compiled backward of a traced call cannot run on these "
                               f"lengths ({self.bwd.executable.last_exit}); trace it with "
                               "dynamic=False")
        if first:
            self.stats.compile_seconds += kernel.compile_seconds
            if getattr(kernel, "fallback", None):  # (lowered now: runtime.pipeline)
                self.stats.event("backend_fallback", kernel.fallback)
        self.stats.compiled_backwards += 1
        # an input none of the walked outputs reaches gets no gradient (its .grad stays
        # None, hn.grad calls it unused), as eager's walk never meets it
        return [wrap(np.asarray(o).reshape(i.shape)) if reach & slots.keys() else None
                for o, i, reach in zip(outs, node.inputs, self.bwd.reach)]

    def _eager_backward(self, node, slots, value_of):
        if node.replay is None:
            raise RuntimeError("create_graph=True through a traced call whose saved values "
                               "a backward() freed: pass retain_graph=True to that one")
        arrays, versions = node.replay
        if any(a.shape != tuple(i.shape) for a, i in zip(arrays, self.tg.graph.inputs)):
            raise RuntimeError("create_graph=True through a traced call whose loop ran another "
                               "length than the one traced: trace the function with "
                               "dynamic=False to differentiate it twice")
        for vc, version in versions:
            if vc[0] != version:
                raise RuntimeError("one of the values needed for gradient computation has "
                                   "been modified by an in-place operation: an input of a "
                                   f"compiled call is at version {vc[0]}; expected {version} "
                                   "(create_graph=True replays the call's forward from its "
                                   "inputs, so every input must be unchanged until then; "
                                   "call the function untraced to update one before)")
        self.stats.event("fallback", "create_graph=True through a traced call: its graph "
                         "ran eagerly, with history, for higher-order gradients")
        graph = self.tg.graph
        values = {}
        wrt = dict(zip(self.tg.grad_inputs, node.inputs))
        for i, inp in enumerate(graph.inputs):
            values[id(inp)] = value_of(wrt[i]) if i in wrt else wrap(arrays[i])
        for n in graph.nodes:
            if id(n) in values:
                continue
            if id(n) in self.tg.blocked:  # (recorded under no_grad: replayed so)
                with no_grad():
                    values[id(n)] = _eager_node(n, values)
            else:
                values[id(n)] = _eager_node(n, values)
        roots = [values[id(graph.outputs[k])] for k in self.tg.grad_results]
        live = [(r, slots[s]) for s, r in enumerate(roots) if s in slots and r._rg]
        found = {}
        targets = {id(n): j for j, n in enumerate(node.inputs)}

        def sink(n, g):
            i = targets.get(id(n))
            if i is not None:
                found[i] = g

        engine_backward([r._node for r, _ in live], [g for _, g in live], EMIT, value_of,
                        sink, stop=frozenset(targets))
        return [found.get(i) if reach & slots.keys() else None
                for i, reach in zip(range(len(node.inputs)), self.bwd.reach)]


def _eager_node(n, values):
    if n.op == "const":
        value = n.attrs["value"]
        return wrap(np.array(value, dtype=n.dtype))
    return apply(n.op, [values[id(i)] for i in n.inputs], dict(n.attrs))


def _versions(tensors) -> tuple:
    """(version counter, its version now) of each tensor (None: an optimizer setting, a
    number rather than a tensor, is skipped)."""
    out = []
    for t in tensors:
        if t is not None:
            vc = version_counter(t)
            out.append((vc, vc[0]))
    return tuple(out)


def _shares(data, arrays) -> bool:
    for a in arrays:
        if np.may_share_memory(data, a):
            return True
    return False
