"""One LSTM step as a fused eager op (`hybridnet.fused`): the recurrent product, the
gates and the new state in a few NumPy calls and one tape node, where the composite
(`rnn.lstm_step`) records 17 ops and its backward emits about 30 more. The result is the
stacked (2, batch, hidden) state [h', c'], of which the caller takes the two views.

The forward computes exactly the composite's ops in its order (the same values, bit for
bit); the backward is written in NumPy (gradients of the gates from the saved
activations, then one product each for the input state and the weight), and runs the
composite's vjps instead when the backward records history (create_graph).
"""

import numpy as np

from compiler import blas
from compiler.ops import REGISTRY

from .. import fused
from ..shape import cat, stack
from ..tensor import Tensor, wrap

_sigmoid = REGISTRY["sigmoid"].impl


def lstm_step(x_proj, h, c, w_hh, b_hh, composite):
    """The stacked (h', c') of one step, fused (None: take `composite`, a function of
    the same five tensors, b_hh possibly None, returning the stacked state)."""
    if not fused.enabled() or not fused.float_tensors(x_proj, h, c, w_hh, b_hh) or \
            not isinstance(h, Tensor) or h._data.ndim != 2 or c._data.shape != h._data.shape:
        return None
    batch, hidden = h._data.shape
    if x_proj._data.shape != (batch, 4 * hidden) or w_hh._data.shape != (4 * hidden, hidden) \
            or (b_hh is not None and b_hh._data.shape != (4 * hidden,)):
        return None
    gates = np.add(x_proj._data, blas.matmul(h._data, w_hh._data.T))
    if b_hh is not None:
        np.add(gates, b_hh._data, out=gates)
    n = hidden
    i, f = _sigmoid(gates[:, :n]), _sigmoid(gates[:, n:2 * n])
    g, o = np.tanh(gates[:, 2 * n:3 * n]), _sigmoid(gates[:, 3 * n:])
    out = np.empty((2, batch, hidden), gates.dtype)
    np.multiply(f, c._data, out=out[1])
    out[1] += i * g
    tc = np.tanh(out[1])
    np.multiply(o, tc, out=out[0])
    ins = (x_proj, h, c, w_hh) + (() if b_hh is None else (b_hh,))
    return fused.result("lstm_step", out, ins, _grad, composite, (i, f, g, o, tc),
                        saves=(h, c, w_hh))


def _grad(node, e, g, value_of):
    if not e.in_place:
        return fused.replay(node, e, g, value_of)
    i, f, gg, o, tc = node.extra
    h, c, w = (n.value for n in node.inputs[1:4])
    dh, dc = g._data[0], g._data[1]
    dct = dc + dh * o * (1 - tc * tc)
    n = i.shape[1]
    dgates = np.empty((i.shape[0], 4 * n), i.dtype)
    np.multiply(dct * gg, i * (1 - i), out=dgates[:, :n])
    np.multiply(dct * c, f * (1 - f), out=dgates[:, n:2 * n])
    np.multiply(dct * i, 1 - gg * gg, out=dgates[:, 2 * n:3 * n])
    np.multiply(dh * tc, o * (1 - o), out=dgates[:, 3 * n:])
    wants = [x.requires_grad for x in node.inputs]
    grads = [wrap(dgates) if wants[0] else None,
             wrap(blas.matmul(dgates, w)) if wants[1] else None,
             wrap(dct * f) if wants[2] else None,
             wrap(blas.matmul(dgates.T, h)) if wants[3] else None]
    if len(wants) > 4:
        grads.append(wrap(np.add.reduce(dgates, axis=0)) if wants[4] else None)
    return grads


# ---- a whole direction of an LSTM layer -----------------------------------------------------


def lstm_layer(proj, h0, c0, w_hh, b_hh, reverse, composite):
    """One direction of an LSTM layer over the sequence, fused: `proj` (T, B, 4H) holds
    every step's input projection (x @ W_ih.T + b_ih). Returns the packed (T + 1, B, H)
    result (the T outputs, then the final cell state), or None: take `composite`, a
    function of the same five tensors (b_hh possibly None) returning the packed result.

    One tape node for the sequence where the steps record 5 ops each; its backward runs
    the whole BPTT loop in NumPy, and the recurrent weight's gradient is one product over
    every step, (4H, T*B) @ (T*B, H), instead of T small ones."""
    if not fused.enabled() or not fused.float_tensors(proj, h0, c0, w_hh, b_hh) or \
            proj._data.ndim != 3 or h0._data.ndim != 2 or proj._data.shape[0] == 0:
        return None
    steps, batch, four = proj._data.shape
    n = h0._data.shape[1]
    if four != 4 * n or h0._data.shape != (batch, n) or c0._data.shape != (batch, n) or \
            w_hh._data.shape != (4 * n, n) or \
            (b_hh is not None and b_hh._data.shape != (4 * n,)):
        return None
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    wt = np.ascontiguousarray(w_hh._data.T)  # (a row-major right operand: 1.7x faster here)
    p, bias = proj._data, None if b_hh is None else b_hh._data
    acts = np.empty((steps, batch, 4 * n), p.dtype)
    cells = np.empty((steps + 1, batch, n), p.dtype)  # the cell state before each step
    tcs = np.empty((steps, batch, n), p.dtype)
    hs = np.empty((steps, batch, n), p.dtype)  # (private: the result may be updated)
    h, cells[0] = h0._data, c0._data
    for k, t in enumerate(order):
        gates = np.add(p[t], blas.matmul(h, wt))
        if bias is not None:
            np.add(gates, bias, out=gates)
        a = acts[k]
        a[...] = _sigmoid(gates)
        np.tanh(gates[:, 2 * n:3 * n], out=a[:, 2 * n:3 * n])
        np.multiply(a[:, n:2 * n], cells[k], out=cells[k + 1])
        cells[k + 1] += a[:, :n] * a[:, 2 * n:3 * n]
        np.tanh(cells[k + 1], out=tcs[k])
        h = np.multiply(a[:, 3 * n:], tcs[k], out=hs[t])
    packed = np.concatenate([hs, cells[steps:]])
    ins = (proj, h0, c0, w_hh) + (() if b_hh is None else (b_hh,))
    return fused.result("lstm_layer", packed, ins, _layer_grad, composite,
                        (acts, cells, tcs, hs, bool(reverse)), saves=(h0, w_hh))


def _layer_grad(node, e, g, value_of):
    if not e.in_place:
        return fused.replay(node, e, g, value_of)
    acts, cells, tcs, hs, reverse = node.extra
    h0, w = node.inputs[1].value, node.inputs[3].value
    grad = g._data
    steps, batch, n = tcs.shape
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    dgates = np.empty((steps, batch, 4 * n), grad.dtype)  # indexed by time, as proj
    dh, dc = np.zeros((batch, n), grad.dtype), grad[steps].copy()
    for k in range(steps - 1, -1, -1):
        t = order[k]
        a, tc = acts[k], tcs[k]
        i, f, gg, o = a[:, :n], a[:, n:2 * n], a[:, 2 * n:3 * n], a[:, 3 * n:]
        dh = dh + grad[t]
        dct = dc + dh * o * (1 - tc * tc)
        d = dgates[t]
        np.multiply(dct * gg, i * (1 - i), out=d[:, :n])
        np.multiply(dct * cells[k], f * (1 - f), out=d[:, n:2 * n])
        np.multiply(dct * i, 1 - gg * gg, out=d[:, 2 * n:3 * n])
        np.multiply(dh * tc, o * (1 - o), out=d[:, 3 * n:])
        dc = dct * f
        dh = blas.matmul(d, w)
    wants = [x.requires_grad for x in node.inputs]
    grads = [wrap(dgates) if wants[0] else None, wrap(dh) if wants[1] else None,
             wrap(dc) if wants[2] else None, None]
    if wants[3]:  # (the state before the step at each time)
        prev = np.concatenate([hs[1:], h0[None]]) if reverse else \
            np.concatenate([h0[None], hs[:-1]])
        grads[3] = wrap(blas.matmul(dgates.reshape(-1, 4 * n).T, prev.reshape(-1, n)))
    if len(wants) > 4:
        grads.append(wrap(np.add.reduce(dgates, axis=(0, 1))) if wants[4] else None)
    return grads


def layer_composite(step, reverse):
    """The composite of `lstm_layer`: `step(x_proj, h, c, w_hh, b_hh)` -> (h, c) per time
    step, packed as lstm_layer packs."""
    def run(proj, h0, c0, w_hh, b_hh=None):
        steps = proj.shape[0]
        outs, h, c = [None] * steps, h0, c0
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            h, c = step(proj[t], h, c, w_hh, b_hh)
            outs[t] = h
        return cat([stack(outs, 0), c.reshape(1, *c.shape)], 0)
    return run
