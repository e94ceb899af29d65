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
