"""`hn.explain(fn, *args)`: what the JIT captured, guarded, fused, compiled or refused."""

from compiler.loop import describe as describe_loops
from compiler.passes.fusion import describe as describe_units

from .keys import describe_dim, describe_meta
from .traced import TracedFunction, trace


class ExplainReport:
    """Printable report; `.to_dict()` gives the same content as plain data."""

    def __init__(self, traced: TracedFunction):
        self.name = getattr(traced.fn, "__name__", type(traced.fn).__name__)
        self.stats = traced.stats.to_dict()
        self.specializations = [_spec_dict(s) for s in traced.specializations.values()]

    def to_dict(self) -> dict:
        """Plain data (graphs as text)."""
        return {"function": self.name, "stats": self.stats,
                "specializations": self.specializations}

    def __str__(self) -> str:
        lines = [f"== hn.explain: {self.name} =="]
        s = self.stats
        lines.append(f"calls {s['calls']}: compiled {s['compiled_calls']}, eager "
                     f"{s['eager_calls']}; cache hits {s['hits']}, misses {s['misses']}, "
                     f"side exits {s['side_exits']}; compiles {s['compiles']}, kernel reuses "
                     f"{s['kernel_reuses']}; compile time {s['compile_seconds']:.3f}s, "
                     f"trace time {s['trace_seconds']:.3f}s")
        for i, spec in enumerate(self.specializations):
            lines.append(f"\n-- specialization {i}: {spec['inputs']}")
            if spec["symbolic"]:
                lines.append(f"   symbolic sizes (*, loop trip counts): {spec['symbolic']}")
            if spec["fallback"]:
                lines.append(f"   runs eagerly: {spec['fallback']}")
            for j, tr in enumerate(spec["traces"]):
                lines.extend(_trace_lines(j, tr))
        if s["events"]:
            lines.append("\n-- events")
            for ev in s["events"]:
                lines.append(f"   call {ev['call']}: {ev['kind']}: {ev['detail']}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def _trace_lines(j, tr):
    lines = [f"   trace {j}: {len(tr['guards'])} guards, compiled in "
             f"{tr['compile_seconds']:.3f}s{' (kernel reused)' if tr['reused'] else ''}"]
    lines.append(f"     backend: {tr['backend']}; compile phases: " + ", ".join(
        f"{k} {v * 1e3:.1f}ms" for k, v in tr["phases"].items()))
    if tr["backend_fallback"]:
        lines.append(f"     backend fallback: {tr['backend_fallback']}")
    if tr["symbolic"]:
        lines.append(f"     {tr['symbolic']}")
    if tr["threads"]:
        lines.append(f"     BLAS threads: {tr['threads']}")
    for g in tr["guards"]:
        lines.append(f"     guard: {g}")
    lines.append("     captured graph:")
    lines.extend("       " + ln for ln in tr["graph"].splitlines())
    lines.append("     optimized graph:")
    lines.extend("       " + ln for ln in tr["optimized"].splitlines())
    lines.append("     passes: " + ", ".join(f"{p['name']} {p['seconds'] * 1e3:.2f}ms"
                                              for p in tr["passes"]))
    lines.append("     fused kernels:")
    lines.extend("       " + ln for ln in tr["kernels"])
    if tr["loops"]:
        lines.append("     rerolled loops (compiler.reroll):")
        lines.extend("       " + ln for ln in tr["loops"])
    bwd = tr.get("backward")
    if bwd:
        lines.append(f"     backward (compiled{', kernel reused' if bwd['reused'] else ''}; "
                     f"the optimized graph above is the forward; {len(bwd['saved'])} "
                     f"saved values, {bwd['kept']} of them its own inputs, the rest returned by "
                     f"it too; {len(bwd['recomputed'])} values "
                     "recomputed in the backward instead of saved):")
        lines.extend(f"       saved: {v}" for v in bwd["saved"])
        lines.extend(f"       recomputed: {v}" for v in bwd["recomputed"])
        lines.append("     backward graph (saved values, then one seed per result):")
        lines.extend("       " + ln for ln in bwd["graph"].splitlines())
        lines.append("     backward kernels:")
        lines.extend("       " + ln for ln in bwd["kernels"])
        if bwd["threads"]:
            lines.append(f"     backward BLAS threads: {bwd['threads']}")
        if bwd["loops"]:
            lines.append("     backward loops:")
            lines.extend("       " + ln for ln in bwd["loops"])
    return lines


def _spec_dict(spec) -> dict:
    metas = spec.key[1] if isinstance(spec.key, tuple) and len(spec.key) > 1 else ()
    inputs = ", ".join(describe_meta(m) for m in metas)
    least = {(i, d): m for t in spec.traces for i, d, m in t.min_sizes}
    hulls = {(h.i, h.d): h for t in spec.traces for h in [t.hull] if h is not None}
    symbolic = "; ".join(describe_dim(metas, i, d) + (
        f" (sizes below {least[(i, d)]} run eagerly)" if (i, d) in least else "") +
        (_hull_text(hulls[(i, d)]) if (i, d) in hulls else "")
        for i, d in sorted(spec.symbolic))
    return {"inputs": f"({inputs})", "fallback": spec.fallback, "symbolic": symbolic,
            "traces": [_trace_dict(t) for t in spec.traces]}


def _hull_text(hull) -> str:
    """What dynamic.Hull confirmed: the lengths served, probed beyond."""
    refuted = [f"{n} and above" for n in [hull.above] if n is not None] + \
        [f"{n} and below" for n in [hull.below] if n is not None]
    return (f" (confirmed for {hull.lo}..{hull.hi}; other lengths are probed first" +
            (f"; {', '.join(refuted)} run eagerly" if refuted else "") + ")")


def _trace_dict(tr) -> dict:
    res = tr.result
    guards = [f"{kind}(output {k}) == {value!r}" for k, kind, value in tr.tg.guards]
    guards += [f"read: {check.text}" for check in tr.tg.checks]
    guards += [f"runtime input: {_source_text(src)}" for src in tr.tg.sources
               if src.kind in ("hyper", "grad")]
    backend, fallback = _backend(res)
    return {
        "graph": str(tr.tg.graph), "optimized": str(res.optimized), "guards": guards,
        "passes": [{k: p[k] for k in ("name", "seconds", "changed")} for p in res.pass_report],
        "kernels": describe_units(res.program.units), "source": res.kernel.source,
        "compile_seconds": res.seconds + (0.0 if backend == "llvm" else
                                          res.kernel.compile_seconds),
        "reused": res.reused, "backend": backend, "backend_fallback": fallback,
        "phases": _phases(res, backend),
        "symbolic": _symbolic(res),
        "threads": _threads(res),
        "writebacks": len(tr.tg.writebacks), "backward": _backward_dict(res.backward),
        "loops": describe_loops(res.optimized),
    }


def _symbolic(res) -> str:
    """How a kernel for every length (compiler.lowering.llvm_sym) finds its length."""
    program = res.program if getattr(res.kernel, "compiled", False) else None
    sym = getattr(program, "sym", None)
    if sym is None:
        return ""
    i, d, size = sym
    least, most = getattr(res, "lengths", (program.min_n, program.max_n))
    return (f"one llvm kernel for every length n: kernel input {i}'s dim {d} is {size!r}; "
            f"it serves n >= {least}" + ("" if most is None else f" and n <= {most}") +
            f"; made from traces at n = {getattr(res, 'traced_at', '?')}")


def _threads(res) -> str:
    """How the kernel (of a CompileResult or a Backward) runs its large products
    (compiler/thread_choice.py), once compiled."""
    kernel = res.kernel if getattr(res.kernel, "compiled", False) else None
    chooser = getattr(kernel, "threads_choice", None)
    return "" if chooser is None else chooser.describe()


def _backend(res) -> tuple:
    """(backend, why another backend compiled it): a kernel lowered at its first call
    (runtime.pipeline.DeferredKernel) may have gone to numba then."""
    late = getattr(res.kernel, "fallback", None)
    return ("numba", late) if late else (res.backend, res.fallback)


def _phases(res, backend) -> dict:
    """Seconds per compile phase: the graph passes, then the backend's own (llvm: lower,
    llvm_parse, llvm_optimize, machine_code, load; or load alone from the disk cache)."""
    phases = {"optimize": sum(p["seconds"] for p in res.pass_report)}
    if res.reused:
        phases["kernel reused"] = 0.0
    elif backend == "llvm":
        phases.update(res.kernel.phases)
    else:
        phases["numba compile" + (" (disk cache)" if getattr(res.kernel, "from_disk", False)
                                  else "")] = res.kernel.compile_seconds
    return phases


def _backward_dict(bwd):
    """The compiled backward of a trace whose results need grad (None otherwise)."""
    if bwd is None:
        return None
    fwd = bwd.split.forward
    saved = fwd.outputs[len(fwd.outputs) - bwd.split.saved:]
    kept = [k is not None and k < 0 for k in bwd.saved_sources or [None] * len(saved)]
    return {"graph": str(bwd.split.backward), "kept": sum(kept),
            "saved": [f"{n.op} {n.type_str()}" + (
                " (the call's own input array, not copied)" if own else "")
                for n, own in zip(saved, kept)],
            "recomputed": [f"{n.op} {n.type_str()}" for n in bwd.split.recomputed or ()],
            "kernels": describe_units(bwd.program.units), "source": bwd.kernel.source,
            "reused": bwd.reused, "loops": describe_loops(bwd.split.backward),
            "threads": _threads(bwd)}


def _source_text(src) -> str:
    if src.kind == "hyper":
        _, key, index = src.ref
        return f"optimizer setting {key!r}" + ("" if index is None else f"[{index}]")
    return f".grad ({src.dtype}{list(src.shape)}) of a parameter"


def explain(fn, *args, **kwargs) -> ExplainReport:
    """Trace and compile `fn` on `args` (running it twice), then report what happened.
    A traced function that has run already, given no arguments, is reported as it
    stands (not called again: a training step would take two more steps)."""
    traced = fn if isinstance(fn, TracedFunction) else trace(fn)
    if args or kwargs or traced.stats.calls == 0:
        traced(*args, **kwargs)
        traced(*args, **kwargs)
    return ExplainReport(traced)
