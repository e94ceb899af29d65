"""Recurrent layers: RNNCell, LSTMCell, GRUCell and the sequence layers RNN, LSTM, GRU.

Parameter names, gate order (LSTM: i, f, g, o; GRU: r, z, n) and initialisation
U(-1/sqrt(hidden), 1/sqrt(hidden)) follow PyTorch. Sequence layers run a Python
loop over time steps, so any sequence length works; the input projection of a
whole layer is one matmul.
"""

import math

from compiler.errors import ShapeError

from .. import functional as _f
from ..creation import empty, zeros
from ..shape import chunk, stack
from . import fused_lstm, init
from .module import Module
from .parameter import Parameter

_GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}


def _act(nonlinearity):
    if nonlinearity == "tanh":
        return _f.tanh
    if nonlinearity == "relu":
        return _f.relu
    raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")


def rnn_step(x_proj, h, w_hh, b_hh, act):
    """One Elman step, given x @ W_ih.T + b_ih."""
    hh = h @ w_hh.T
    return act(x_proj + (hh if b_hh is None else hh + b_hh))


def lstm_step(x_proj, state, w_hh, b_hh):
    """One LSTM step: gates i, f, g, o (one fused op when eager: nn/fused_lstm.py)."""
    h, c = state
    both = fused_lstm.lstm_step(x_proj, h, c, w_hh, b_hh, _stacked_lstm_step)
    if both is not None:
        return both[0], both[1]
    return _lstm_step(x_proj, h, c, w_hh, b_hh)


def _stacked_lstm_step(x_proj, h, c, w_hh, b_hh=None):
    return stack(list(_lstm_step(x_proj, h, c, w_hh, b_hh)), 0)


def _lstm_step(x_proj, h, c, w_hh, b_hh):
    gates = x_proj + h @ w_hh.T
    if b_hh is not None:
        gates = gates + b_hh
    i, f, g, o = chunk(gates, 4, -1)
    c = _f.sigmoid(f) * c + _f.sigmoid(i) * _f.tanh(g)
    return _f.sigmoid(o) * _f.tanh(c), c


def gru_step(x_proj, h, w_hh, b_hh):
    """One GRU step: gates r, z, n (n = tanh(x_n + r * (W_hn h + b_hn)))."""
    hh = h @ w_hh.T
    if b_hh is not None:
        hh = hh + b_hh
    xr, xz, xn = chunk(x_proj, 3, -1)
    hr, hz, hn = chunk(hh, 3, -1)
    r = _f.sigmoid(xr + hr)
    z = _f.sigmoid(xz + hz)
    n = _f.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h


class _CellBase(Module):
    def __init__(self, kind, input_size, hidden_size, bias, dtype):
        super().__init__()
        g = _GATES[kind]
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih = Parameter(empty(g * hidden_size, input_size, dtype=dtype))
        self.weight_hh = Parameter(empty(g * hidden_size, hidden_size, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(empty(g * hidden_size, dtype=dtype))
            self.bias_hh = Parameter(empty(g * hidden_size, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        bound = 1.0 / math.sqrt(hidden_size) if hidden_size else 0.0
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _prep(self, input, hx):
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ShapeError(f"{type(self).__name__}: expected input of shape (batch, "
                             f"{self.input_size}) or ({self.input_size},), got "
                             f"{list(input.shape)}")
        batched = input.ndim == 2
        x = input if batched else input.reshape(1, -1)
        if hx is None:
            hx = zeros(x.shape[0], self.hidden_size, dtype=input.dtype)
        elif not batched:
            hx = hx.reshape(1, -1)
        return x, hx, batched

    def _proj(self, x):
        out = x @ self.weight_ih.T
        return out if self.bias_ih is None else out + self.bias_ih

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}"


class RNNCell(_CellBase):
    """h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", dtype=None):
        super().__init__("RNN", input_size, hidden_size, bias, dtype)
        self.nonlinearity = nonlinearity
        _act(nonlinearity)

    def forward(self, input, hx=None):
        x, h, batched = self._prep(input, hx)
        h = rnn_step(self._proj(x), h, self.weight_hh, self.bias_hh, _act(self.nonlinearity))
        return h if batched else h.reshape(-1)


class LSTMCell(_CellBase):
    """LSTM cell; forward(input, (h, c)) returns (h', c')."""

    def __init__(self, input_size, hidden_size, bias=True, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, bias, dtype)

    def forward(self, input, hx=None):
        h0, c0 = (None, None) if hx is None else hx
        x, h, batched = self._prep(input, h0)
        c = zeros(*h.shape, dtype=input.dtype) if c0 is None else c0.reshape(*h.shape)
        h, c = lstm_step(self._proj(x), (h, c), self.weight_hh, self.bias_hh)
        return (h, c) if batched else (h.reshape(-1), c.reshape(-1))


class GRUCell(_CellBase):
    """GRU cell; forward(input, h) returns h'."""

    def __init__(self, input_size, hidden_size, bias=True, dtype=None):
        super().__init__("GRU", input_size, hidden_size, bias, dtype)

    def forward(self, input, hx=None):
        x, h, batched = self._prep(input, hx)
        h = gru_step(self._proj(x), h, self.weight_hh, self.bias_hh)
        return h if batched else h.reshape(-1)
