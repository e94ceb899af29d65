"""Sequence layers RNN, LSTM, GRU over (seq, batch, feature) or batch_first inputs."""

import math

from compiler.errors import ShapeError

from .._state import STATE
from ..creation import empty, zeros
from ..shape import cat, stack
from . import functional as F
from . import fused_lstm, init
from .module import Module
from .parameter import Parameter
from .rnn import _GATES, _act, _lstm_step, gru_step, lstm_step, rnn_step


def _project(x, w_ih, b_ih):
    out = x @ w_ih.T
    return out if b_ih is None else out + b_ih


class _RNNBase(Module):
    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, dtype=None):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional = float(dropout), bidirectional
        dirs = 2 if bidirectional else 1
        g = _GATES[mode]
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * dirs
            for suffix in ("", "_reverse")[:dirs]:
                names = self._names(layer, suffix)
                setattr(self, names[0], Parameter(empty(g * hidden_size, width, dtype=dtype)))
                setattr(self, names[1], Parameter(empty(g * hidden_size, hidden_size,
                                                        dtype=dtype)))
                if bias:
                    setattr(self, names[2], Parameter(empty(g * hidden_size, dtype=dtype)))
                    setattr(self, names[3], Parameter(empty(g * hidden_size, dtype=dtype)))
        bound = 1.0 / math.sqrt(hidden_size) if hidden_size else 0.0
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    @staticmethod
    def _names(layer, suffix):
        return tuple(f"{kind}_l{layer}{suffix}" for kind in
                     ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    def _weights(self, layer, suffix):
        w_ih, w_hh, b_ih, b_hh = self._names(layer, suffix)
        get = self._parameters.get
        return get(w_ih), get(w_hh), get(b_ih), get(b_hh)

    def _check_input(self, input):
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "(batch, seq, feature)" if self.batch_first else "(seq, batch, feature)"
            raise ShapeError(f"{self.mode}: expected input {layout} or (seq, feature) with "
                             f"feature={self.input_size}, got {list(input.shape)}")

    def _initial(self, hx, batch, dtype, batched):
        dirs = 2 if self.bidirectional else 1
        shape = (self.num_layers * dirs, batch, self.hidden_size)
        if hx is None:
            return zeros(*shape, dtype=dtype)
        if not batched:
            hx = hx.reshape(hx.shape[0], 1, hx.shape[-1])
        if hx.shape != shape:
            raise ShapeError(f"{self.mode}: expected hidden state of shape {list(shape)}, "
                             f"got {list(hx.shape)}")
        return hx

    def _run_direction(self, xs, state, layer, suffix):
        w_ih, w_hh, b_ih, b_hh = self._weights(layer, suffix)
        steps, batch = xs.shape[0], xs.shape[1]
        proj = None
        if STATE.tracer is None:  # one product for every step's input projection
            proj = (xs.reshape(steps * batch, -1) @ w_ih.T)
            if b_ih is not None:
                proj = proj + b_ih
            proj = proj.reshape(steps, batch, -1)
        # (traced, each step projects its own input: the trace then names no steps * batch
        # size, and its rerolled loop serves every length, compiler.reroll)
        if self.mode == "LSTM" and proj is not None:
            packed = fused_lstm.lstm_layer(proj, state[0], state[1], w_hh, b_hh, bool(suffix),
                                           fused_lstm.layer_composite(_lstm_step, bool(suffix)))
            if packed is not None:  # (outputs, then the final state, as views)
                return packed[:steps], (packed[0 if suffix else steps - 1], packed[steps])
        order = range(steps - 1, -1, -1) if suffix else range(steps)
        outs = [None] * steps
        for t in order:
            x_t = proj[t] if proj is not None else _project(xs[t], w_ih, b_ih)
            state = self._step(x_t, state, w_hh, b_hh)
            outs[t] = state[0] if self.mode == "LSTM" else state
        return stack(outs, 0) if steps else xs[:, :, :0], state

    def _step(self, x_proj, state, w_hh, b_hh):
        if self.mode == "LSTM":
            return lstm_step(x_proj, state, w_hh, b_hh)
        if self.mode == "GRU":
            return gru_step(x_proj, state, w_hh, b_hh)
        return rnn_step(x_proj, state, w_hh, b_hh, _act(self.nonlinearity))

    def _forward(self, input, h0, c0):
        self._check_input(input)
        batched = input.ndim == 3
        x = input if batched else input.reshape(input.shape[0], 1, input.shape[1])
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        batch = x.shape[1]
        h0 = self._initial(h0, batch, input.dtype, batched)
        c0 = self._initial(c0, batch, input.dtype, batched) if self.mode == "LSTM" else None
        dirs = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for d, suffix in enumerate(("", "_reverse")[:dirs]):
                k = layer * dirs + d
                state = (h0[k], c0[k]) if c0 is not None else h0[k]
                out, state = self._run_direction(x, state, layer, suffix)
                outs.append(out)
                h_n.append(state[0] if c0 is not None else state)
                if c0 is not None:
                    c_n.append(state[1])
            x = outs[0] if dirs == 1 else cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        out = x.transpose(0, 1) if batched and self.batch_first else x
        h_n, c_n = stack(h_n, 0), (stack(c_n, 0) if c_n else None)
        if not batched:
            out = out.reshape(out.shape[0], -1)
            h_n = h_n.reshape(h_n.shape[0], -1)
            c_n = c_n.reshape(c_n.shape[0], -1) if c_n is not None else None
        return out, h_n, c_n

    def extra_repr(self) -> str:
        extra = f", num_layers={self.num_layers}" if self.num_layers > 1 else ""
        extra += ", batch_first=True" if self.batch_first else ""
        extra += ", bidirectional=True" if self.bidirectional else ""
        return f"{self.input_size}, {self.hidden_size}{extra}"


class RNN(_RNNBase):
    """Elman RNN (tanh or relu); forward(input, h0) returns (output, h_n)."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, dtype=None):
        _act(nonlinearity)
        self.nonlinearity = nonlinearity
        super().__init__("RNN", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, dtype)

    def forward(self, input, hx=None):
        out, h_n, _ = self._forward(input, hx, None)
        return out, h_n


class LSTM(_RNNBase):
    """LSTM; forward(input, (h0, c0)) returns (output, (h_n, c_n))."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, dtype)

    def forward(self, input, hx=None):
        h0, c0 = (None, None) if hx is None else hx
        out, h_n, c_n = self._forward(input, h0, c0)
        return out, (h_n, c_n)


class GRU(_RNNBase):
    """GRU; forward(input, h0) returns (output, h_n)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, dtype)

    def forward(self, input, hx=None):
        out, h_n, _ = self._forward(input, hx, None)
        return out, h_n
