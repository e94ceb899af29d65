"""From a TraceGraph to a CompileResult: reroll loops, differentiate, optimize, then ask
the runtime's pipeline (runtime.pipeline) for a compiled Executable from the chosen
backend (runtime.backends: "numba" or "llvm").
"""

import time

from compiler.autodiff import inputs_read_by_vjps, reaching
from compiler.errors import LoweringError
from compiler.gradient import split_gradient
from compiler.ir import Graph
from compiler.loop import is_loop
from compiler.loop_hoist import hoist_products
from compiler.passes.manager import optimize as run_passes
from compiler.reroll import reroll
from runtime.pipeline import compile_graph

from .dynamic import loop_dims, loop_trips


def optimize(graph):
    """Run the default pass pipeline (a report per pass)."""
    return run_passes(graph)


class CompileResult:
    """The executable plus what explain() reports about how it was made."""

    def __init__(self, executable, optimized, program, kernel, pass_report, reused, seconds):
        self.executable = executable
        self.optimized = optimized
        self.program = program
        self.kernel = kernel
        self.pass_report = pass_report
        self.reused = reused
        self.seconds = seconds
        self.backward = None  # Backward, for a trace whose results carry gradients
        self.loop_trips = ()  # the trip counts of its loops that iterate over sizes
        self.loop_dims = {}  # (flat argument, dim) -> trip counts of the loops slicing it
        self.backend = "numba"  # the backend that compiled it
        self.fallback = None  # why the chosen backend passed it to numba, if it did


def compile_trace(tg, dynamic, backend="numba", lazy=False) -> CompileResult:
    """Compile a TraceGraph; raises LoweringError when the backend cannot take it.

    A trace whose results carry gradients (`tg.grad_results`) compiles its forward and
    backward together (`compiler.partition.split_gradient`): the forward also returns the
    values the backward reads, and `CompileResult.backward` runs the backward. `lazy`:
    a trace with loops is lowered at its kernels' first call (runtime.pipeline.
    DeferredKernel), as it may never run (its length generalizes first)."""
    start = time.perf_counter()
    if tg.grad_results:
        # (only the inputs some differentiable result reaches: the others get no .grad)
        reach = reaching(tg.graph, [tg.graph.inputs[i] for i in tg.grad_inputs],
                         tg.grad_results, tg.blocked)
        tg.grad_inputs = [i for i, r in zip(tg.grad_inputs, reach) if r]
        reach = [r for r in reach if r]
        _refuse_updated_saved_inputs(tg)
        wrt = [tg.graph.inputs[i] for i in tg.grad_inputs]
        # (numba: a picked step's gradient window moves with the length, and its
        # size-generic code takes none: those loops' joint graph is rerolled)
        split, report = split_gradient(tg.graph, wrt, tg.grad_results, tg.blocked,
                                       picks=backend != "numba")
        _hoisted(split.forward, report)
        _hoisted(split.backward, report)
        read = inputs_read_by_vjps(tg.graph)
        forward, saved_sources = _without_saved_inputs(split.forward, len(tg.graph.outputs),
                                                    read)
    else:
        forward, report = optimize(reroll(tg.graph)[0])
        _hoisted(forward, report)
    lazy = lazy and bool(loop_trips(forward))
    exe, kernel, program, reused, fallback = compile_graph(
        forward, dynamic, tg.n_results, tg.guards, tg.writebacks, tg.fresh,
        [k for _, k, same, _ in tg.grad_writes if k is not None and same is None],
        len(tg.graph.outputs) if tg.grad_results else None, backend=backend, lazy=lazy)
    result = CompileResult(exe, forward, program, kernel, report, reused, 0.0)
    result.backend = "numba" if fallback or backend == "numba" else backend
    result.fallback = fallback
    result.loop_trips = loop_trips(forward)
    result.loop_dims = loop_dims(tg, forward)
    if tg.grad_results:
        n = len(split.backward.outputs)
        bexe, bkernel, bprogram, breused, bfallback = compile_graph(
            split.backward, dynamic, n, (), (), [True] * n, backend=backend, lazy=lazy)
        result.backward = Backward(split, bexe, bkernel, bprogram, breused, read, reach)
        result.backward.saved_sources = saved_sources
        result.backward.fallback = bfallback
        result.backward.backend = "numba" if bfallback or backend == "numba" else backend
    result.seconds = time.perf_counter() - start
    return result


def _without_saved_inputs(forward, n_out, checked):
    """`forward` without the saved values that are its own inputs eager's vjps read
    (whose versions the call checks, so the backward may read the caller's array: a
    traced layer's weights are not copied per call); returns (graph, sources): per saved
    value, k >= 0 for output k of the graph returned, -1 - i for input i (None: every
    saved value is an output, as in `forward`)."""
    position = {id(n): i for i, n in enumerate(forward.inputs)}
    keep, sources = list(forward.outputs[:n_out]), []
    for node in forward.outputs[n_out:]:
        i = position.get(id(node))
        if i is not None and i in checked:
            sources.append(-1 - i)
        else:
            sources.append(len(keep))
            keep.append(node)
    if len(keep) == len(forward.outputs):
        return forward, None
    return Graph(forward.nodes, forward.inputs, keep), sources


def _hoisted(graph, report):
    """`graph` with its loops' products moved out of them (compiler.loop_hoist, in place),
    reported as a pass."""
    start, before = time.perf_counter(), len(graph.nodes)
    moved = hoist_products(graph) if any(is_loop(n) for n in graph.nodes) else 0
    report.append({"name": "loop_hoist", "changed": bool(moved),
                   "seconds": time.perf_counter() - start, "nodes_before": before,
                   "nodes_after": len(graph.nodes)})
    return graph


def _refuse_updated_saved_inputs(tg):
    """An input the call updates in place that a vjp also reads: eager's backward raises
    or not depending on whether the read came before the update, which the graph does
    not keep; such a call runs eagerly. (After `reaching` marked requires_grad.)"""
    read = set(inputs_read_by_vjps(tg.graph))
    if any(target in read for _, target in tg.writebacks):
        raise LoweringError("the call updates in place a tensor that the backward of its "
                            "results reads; it runs eagerly (as eager, the backward then "
                            "raises or not depending on the order)")


class Backward:
    """The compiled backward of a differentiable trace: `split` (compiler.partition),
    its executable, kernel and program; `reused`: its kernel came from the cache."""

    def __init__(self, split, executable, kernel, program, reused, saved_inputs, reach):
        self.split, self.executable, self.kernel = split, executable, kernel
        self.program, self.reused = program, reused
        self.reach = reach  # per differentiated input: the result slots that reach it
        # graph inputs eager's vjps would read (updated in place before the backward, it
        # raises as eager does)
        self.saved_inputs = saved_inputs
        # per saved value, where a call finds it: k >= 0 the forward kernel's output k,
        # -1 - i the call's input array i (compile._without_saved_inputs); None: the
        # forward's outputs after the results, in order
        self.saved_sources = None
        self.backend = "numba"  # the backend that compiled it
        self.fallback = None


__all__ = ["compile_trace", "CompileResult", "LoweringError"]
