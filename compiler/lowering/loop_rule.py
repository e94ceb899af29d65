"""Lowering of loop nodes (`compiler.loop`): the body is its own jitted function, called
once per step from a loop in the entry.

The body is lowered like any graph, into a `Program` that the entry names as a global
(`B<n>`); the engine compiles it first and puts the jitted function in its place, so
the entry calls it without leaving machine code. The trip count is computed from the
sequences' sizes at run time; a call whose sizes give none raises ValueError with a
message starting "hn-loop" (the executor treats it as a side exit: that call runs
eagerly). Step 0 is written out before the loop, so the collected outputs can be
allocated from the shapes the body returns (the body is generic in sizes too).
"""

from ..loop import is_projection


def body_program(spec, ctx):
    """The lowered body of a loop and which of its outputs may be an input's array (the
    caller lowers the bodies first: `Context.bodies`, by the loop's structure)."""
    return ctx.bodies[spec.key]


def _step_args(em, node, names, t) -> list:
    """The body's arguments at step `t` (an expression)."""
    spec = node.attrs["spec"]
    k, n = spec.n_carried, spec.n_invariant
    args = list(names["carried"]) + list(names["invariants"])
    for s, base, var in zip(spec.seqs, node.inputs[k + n:], names["bases"]):
        start = f"{s.anchor} + {t} * {s.stride}" if s.stride > 0 else \
            f"{var}.shape[{s.dim}] - {s.anchor} + {t} * ({s.stride})"
        index = ", ".join(f"{start}:{start} + {s.width}" if d == s.dim else ":"
                          for d in range(len(base.shape)))
        args.append(f"{var}[{index}]")
    return args


def _emit_step(em, node, names, t, depth, first):
    spec = node.attrs["spec"]
    v, k = names["v"], spec.n_carried
    call = f"{names['body']}({', '.join(_step_args(em, node, names, t))})"
    results = [f"{v}_r"] if names["single"] else [f"{v}_r[{i}]" for i in
                                                   range(len(spec.body.outputs))]
    em.emit(f"{v}_r = {call}", depth)
    for i, c in enumerate(names["carried"]):
        em.emit(f"{c} = np.ascontiguousarray({results[i]})", depth)
    for i, pick in enumerate(spec.picks):
        y, var = results[k + pick.index], names["picks"][i]
        value = f"{y}.copy()" if names["aliased_out"][pick.index] else y
        if first:
            em.emit(f"{var} = {value}", depth)
        else:
            em.emit(f"if {t} == {var}_k:", depth)
            em.emit(f"    {var} = {value}", depth)
    for j, (collect, out) in enumerate(zip(spec.collects, spec.body.outputs[k:])):
        y, acc = results[k + j], names["collected"][j]
        if j not in names["used"]:
            continue
        if first:
            shape = _collected_shape(y, collect, len(out.shape), names["trip"])
            em.emit(f"{acc} = np.empty({shape}, np.{out.dtype.name})", depth)
        block = f"{names['trip']} - 1 - {t}" if collect.reverse else t
        _emit_write(em, acc, y, block, collect, len(out.shape), depth)


def _collected_shape(y, collect, ndim, trip) -> str:
    if collect.dim < 0:
        return f"({trip},) + {y}.shape" if ndim else f"({trip},)"
    dims = [f"{y}.shape[{d}] * {trip}" if d == collect.dim else f"{y}.shape[{d}]"
            for d in range(ndim)]
    return "(" + ", ".join(dims) + ("," if ndim == 1 else "") + ")"


def _emit_write(em, acc, y, block, collect, ndim, depth):
    if collect.dim < 0:
        em.emit(f"{acc}[{block}] = {y}[0]" if not ndim else f"{acc}[{block}] = {y}", depth)
        return
    w = f"{y}.shape[{collect.dim}]"
    index = ", ".join(f"({block}) * {w}:({block} + 1) * {w}" if d == collect.dim else ":"
                      for d in range(ndim))
    em.emit(f"{acc}_w = {acc}[{index}]", depth)
    # element by element: an array assigned into a strided slice compiles ~10x slower
    em.emit(f"for {acc}_q in np.ndindex({y}.shape):", depth)
    em.emit(f"    {acc}_w[{acc}_q] = {y}[{acc}_q]", depth)


def emit_loop(em, node, *inputs):
    """The lines running a loop node; they define the variables of its loop_out users."""
    spec = node.attrs["spec"]
    ctx = em.ctx
    program, aliased = body_program(spec, ctx)
    v = ctx.var(node)
    body = f"B{v}"
    ctx.globals[body] = program
    ctx.uses_blas = ctx.uses_blas or program.uses_blas
    ctx.may_exit = ctx.may_exit or bool(spec.seqs)
    k, n = spec.n_carried, spec.n_invariant
    users = [u for u in em.users.get(id(node), ()) if is_projection(u)]
    names = {"v": v, "body": body, "single": program.single_output, "trip": f"{v}_T",
             "carried": [f"{v}_c{i}" for i in range(k)],
             "collected": [f"{v}_y{j}" for j in range(spec.n_collected)],
             "picks": [f"{v}_p{i}" for i in range(len(spec.picks))],
             "used": {u.attrs["index"] - k for u in users},
             "aliased_out": aliased[k:],
             "bases": [f"{v}_s{i}" for i in range(len(spec.seqs))],
             "invariants": [f"{v}_i{i}" for i in range(n)]}
    for var, expr in zip(names["bases"], inputs[k + n:]):
        em.emit(f"{var} = {expr}")
    # (once per call, not per step: a transposed weight is copied here, not by each step)
    for var, expr in zip(names["invariants"], inputs[k:k + n]):
        em.emit(f"{var} = np.ascontiguousarray({expr})")
    _emit_trip(em, spec, names)
    for var, pick in zip(names["picks"], spec.picks):
        em.emit(f"{var}_k = {names['trip']} - 1 - {pick.step}" if pick.from_end else
                f"{var}_k = {pick.step}")
        em.emit(f"if {var}_k < 0 or {var}_k >= {names['trip']}:")
        em.emit("    raise ValueError('hn-loop: a picked step is out of range')")
    for c, expr in zip(names["carried"], inputs[:k]):
        em.emit(f"{c} = np.ascontiguousarray({expr})")
    _emit_step(em, node, names, "0", 1, True)
    em.emit(f"for {v}_t in range(1, {v}_T):")
    _emit_step(em, node, names, f"{v}_t", 2, False)
    finals = [f"{c}.copy()" if a else c for c, a in zip(names["carried"], aliased)]
    values = finals + names["collected"] + names["picks"]
    for user in users:
        em.emit(f"{ctx.var(user)} = {values[user.attrs['index']]}")


def _emit_trip(em, spec, names):
    """T, the trip count, from the sequences' sizes (they must agree, T >= 1)."""
    T = names["trip"]
    if not spec.seqs:
        em.emit(f"{T} = {spec.trip}")
        return
    for i, (s, var) in enumerate(zip(spec.seqs, names["bases"])):
        span = f"{var}.shape[{s.dim}] - {s.anchor}" + \
            (f" - {s.width + s.gap}" if s.stride > 0 else f" - {s.gap}")
        step = abs(s.stride)
        em.emit(f"{T}_{i} = {span}")
        em.emit(f"if {T}_{i} < 0 or {T}_{i} % {step} != 0:")
        em.emit("    raise ValueError('hn-loop: a sequence fits no whole number of steps')")
        if i == 0:
            em.emit(f"{T} = {T}_{i} // {step} + 1")
        else:
            em.emit(f"if {T}_{i} // {step} + 1 != {T}:")
            em.emit("    raise ValueError('hn-loop: sequences of different lengths')")


def emit_loop_out(em, node, *inputs):
    """Nothing: the loop's lines define loop_out variables."""
