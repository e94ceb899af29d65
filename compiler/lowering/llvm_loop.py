"""Loop nodes (compiler.loop) in the llvm backend: the body is lowered once into its own
function of the module, called once per step from an IR loop.

The trip count is the traced one, a literal of the IR; a kernel serving every length
(compiler.lowering.llvm_sym) makes it a value computed from the symbolic size. No choice
of the emitted code depends on it (step t writes carried buffer (trip - 1 - t) & 1, so the
last step writes the first one whatever the parity). Per step the body gets pointers: the
carried values (the initial value at step 0, then one of two buffers that alternate, so
a step never overwrites what it reads; a carried value the body also collects into a
contiguous block is that block instead, see _in_block), the invariants, each sequence's
slice (a pointer into the sequence when the slice is contiguous, else a copy), the loop's
constants, its outputs (next carried values, and per collected value its block of the
collected output where that block is contiguous, else a temporary copied into the block
after the step) and its temporaries (reused every step); a picked step's value is copied
into its own buffer.
"""

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ..loop import is_projection
from ..passes.fusion import partition
from ..registry import REGISTRY
from .llvm_buf import I8P, I64, Buf, contiguous


@dataclass
class Body:
    """A loop body emitted into the module: its kernel function and buffer counts."""

    fn: object
    n_inputs: int
    n_consts: int
    n_outputs: int
    temps: list


def body_of(em, spec, emit) -> Body:
    """The module's function for a loop body (emitted at the first loop using it);
    `emit(graph, units, module, prefix, fn_names)` is llvm_emit's emission."""
    found = em.bodies.get(spec.key)
    if found is None:
        units = partition(spec.body)
        prefix = f"{em.prefix}_b{len(em.bodies)}"
        sub = emit(spec.body, units, em.module, prefix, em.fn_names)
        sub.kernel.attributes.add("noinline")
        found = em.bodies[spec.key] = Body(sub.kernel, len(spec.body.inputs),
                                           len(sub.consts), len(spec.body.outputs),
                                           list(sub.temps))
    return found


def _contiguous(em, node) -> Buf:
    buf = em.buffer(node)
    if buf.is_contiguous:
        return buf
    tmp = em.temp_buf(buf.shape, buf.dtype)
    em.copy(tmp, buf)
    return tmp


def emit_loop(em, node, emit):
    """Bind the buffers of `node`'s loop_out users; emit the step loop."""
    spec = node.attrs["spec"]
    k, n = spec.n_carried, spec.n_invariant
    bases = node.inputs[k + n:]
    trip = spec.trip_of([tuple(b.shape) for b in bases])
    body = body_of(em, spec, emit)
    outs = spec.body.outputs
    inits = [_contiguous(em, x) for x in node.inputs[:k]]
    invariants = [_contiguous(em, x) for x in node.inputs[k:k + n]]
    seq_bufs = [em.buffer(x) for x in bases]
    step_outs = [em.temp_buf(o.shape, o.dtype) for o in outs[k:]]
    body_temps = [em.new_temp(nbytes) for nbytes in body.temps]
    users = {u.attrs["index"]: u for u in em.users.get(id(node), ()) if is_projection(u)}
    collected = {j: em.new_buffer(users[k + j]) for j in range(spec.n_collected)
                 if k + j in users}
    in_block = _in_block(spec, collected, step_outs)
    pairs = [(em.temp_buf(o.shape, o.dtype),) * 2 if i in in_block else
             (em.temp_buf(o.shape, o.dtype), em.temp_buf(o.shape, o.dtype))
             for i, o in enumerate(outs[:k])]
    picks = [(p, p.at(trip), em.new_buffer(users[k + spec.n_collected + i]))
             for i, p in enumerate(spec.picks) if k + spec.n_collected + i in users]
    const_slots = _body_const_slots(em, node, body)
    b = em.b
    n_args = body.n_inputs + body.n_consts + body.n_outputs + len(body.temps)
    table = em.alloca(ir.ArrayType(I8P, max(1, n_args)))  # (the body's buffer table)
    with em.loop(trip) as t:
        # (step t writes pairs[(trip - 1 - t) & 1]: the last step always writes the first
        # buffer, so no choice of the code depends on the trip count's parity)
        odd = b.icmp_unsigned("!=", b.and_(b.sub(I64(trip - 1), t), I64(1)), I64(0))
        first = b.icmp_unsigned("==", t, I64(0))
        # (a collected value whose block of the output is contiguous is written there by
        # the body; the others go through their temporary and a copy)
        regions = {j: _block(em, spec.collects[j], out, step_outs[j].shape, t, trip)
                   for j, out in collected.items()}
        direct = {j: r for j, r in regions.items() if r.is_contiguous}
        args = []
        for i, (init, (c0, c1)) in enumerate(zip(inits, pairs)):  # init, then the last
            j = in_block.get(i)
            prev = b.select(odd, em.raw(c0), em.raw(c1)) if j is None else em.raw(_block(
                em, spec.collects[j], collected[j], step_outs[j].shape, b.sub(t, I64(1)),
                trip))
            args.append(b.select(first, em.raw(init), prev))
        args += [em.raw(v) for v in invariants]
        for s, base, x in zip(spec.seqs, seq_bufs, bases):
            args.append(_seq_pointer(em, s, base, x, t))
        args += [em.raw(Buf(slot, np.dtype(np.uint8), (1,), (1,))) for slot in const_slots]
        args += [b.select(odd, em.raw(c1), em.raw(c0)) if i not in in_block else
                 em.raw(direct[in_block[i]]) for i, (c0, c1) in enumerate(pairs)]
        args += [em.raw(direct.get(j, o)) for j, o in enumerate(step_outs)]
        args += [em.raw(Buf(slot, np.dtype(np.uint8), (1,), (1,))) for slot in body_temps]
        for j, ptr in enumerate(args):
            b.store(ptr, b.gep(table, [I64(0), I64(j)]))
        b.call(body.fn, [b.bitcast(table, I8P.as_pointer()), em.fn.args[1], I64(0), I64(0)])
        for j, region in regions.items():
            if j not in direct:
                em.copy(region, step_outs[j])
        for p, at, out in picks:
            with b.if_then(b.icmp_unsigned("==", t, I64(at))):
                em.copy(out, direct.get(p.index, step_outs[p.index]))
    for i in range(k):  # the final carried values: written by the last step
        if i in users:
            if i in in_block:  # (its last block, copied: the collected output may die first)
                j = in_block[i]
                em.copy(pairs[i][0], _block(em, spec.collects[j], collected[j],
                                            step_outs[j].shape, I64(trip - 1), trip))
            em.bufs[id(users[i])] = pairs[i][0]


def _in_block(spec, collected, step_outs) -> dict:
    """carried i -> collected j: the body's carried value i is also collected as j (or a
    reshape of it: stack's unsqueeze), into a contiguous block of the output. Step t
    then writes that block, which step t + 1 reads as its carried value: no carried
    buffers, and no copy into the block (an RNN's hidden state, carried and returned
    for every step)."""
    outs, k = spec.body.outputs, spec.n_carried
    found = {}
    for i in range(k):
        for j, out in collected.items():
            block = _contiguous_block(spec.collects[j], out, step_outs[j].shape)
            if block and _regrouped(outs[k + j]) is outs[i]:
                found[i] = j
                break
    return found


def _regrouped(node):
    """The value `node` regroups (reshapes of reshapes), else `node`: the same bytes."""
    while REGISTRY[node.op].regroups:
        node = node.inputs[0]
    return node


def _contiguous_block(collect, out, shape) -> bool:
    if collect.dim < 0:
        return True
    return Buf(out.slot, out.dtype, shape, out.strides, 0).is_contiguous


def _seq_pointer(em, s, base, x, t):
    """Step t's slice of a sequence, as a pointer (a copy when it is strided)."""
    b = em.b
    n = base.shape[s.dim]
    start = b.add(I64(s.anchor), b.mul(t, I64(s.stride))) if s.stride > 0 else \
        b.add(I64(n - s.anchor), b.mul(t, I64(s.stride)))
    shape = list(base.shape)
    shape[s.dim] = s.width
    offset = b.add(I64(base.offset), b.mul(start, I64(base.strides[s.dim])))
    region = Buf(base.slot, base.dtype, tuple(shape), base.strides, offset)
    if all(st == c for st, c, size in zip(region.strides, contiguous(region.shape),
                                          region.shape) if size != 1):
        return em.raw(region)
    tmp = em.temp_buf(region.shape, region.dtype)
    em.copy(tmp, region)
    return em.raw(tmp)


def _block(em, collect, out, shape, t, trip) -> Buf:
    """Step t's block of a collected output (for a step value of `shape`)."""
    b = em.b
    block = b.sub(I64(trip - 1), t) if collect.reverse else t
    if collect.dim < 0:
        offset = b.add(I64(out.offset), b.mul(block, I64(math.prod(shape))))
        return Buf(out.slot, out.dtype, shape, contiguous(shape), offset)
    width = shape[collect.dim]
    offset = b.add(I64(out.offset), b.mul(block, I64(width * out.strides[collect.dim])))
    return Buf(out.slot, out.dtype, shape, out.strides, offset)


def _body_const_slots(em, node, body) -> list:
    """The parent's const slots holding the body's constants (llvm_program.array_consts:
    the graph's own, then each loop body's, depth first)."""
    start = len(em.graph.inputs) + em.const_starts[id(node)]
    return [start + j for j in range(body.n_consts)]


__all__ = ["emit_loop", "body_of", "Body"]
