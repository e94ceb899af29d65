"""Hand-written float64 NumPy references for the nn, loss and optimizer tests.

Nothing here imports hybridnet: these are the independent oracles that layers,
recurrent cells, losses and optimizer update rules are compared against.
"""

import math

import numpy as np

# ---- helpers ------------------------------------------------------------------------------


def np_of(t):
    """A float64/int NumPy copy of a hybridnet tensor (detached)."""
    return np.array(t.detach().numpy())


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # stable for large |x|


def softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def log_softmax(x, dim):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


def gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def layer_norm(x, ndims, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - ndims, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def central_diff(f, x, index, eps=1e-6):
    """d f / d x[index] by central differences (x is modified and restored)."""
    old = x[index]
    x[index] = old + eps
    hi = f()
    x[index] = old - eps
    lo = f()
    x[index] = old
    return (hi - lo) / (2 * eps)


# ---- recurrent cells ---------------------------------------------------------------------


def _affine(x, h, w_ih, w_hh, b_ih, b_hh):
    gx = x @ w_ih.T + (0 if b_ih is None else b_ih)
    gh = h @ w_hh.T + (0 if b_hh is None else b_hh)
    return gx, gh


def rnn_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None, nonlinearity="tanh"):
    gx, gh = _affine(x, h, w_ih, w_hh, b_ih, b_hh)
    pre = gx + gh
    return np.tanh(pre) if nonlinearity == "tanh" else np.maximum(pre, 0.0)


def lstm_cell(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    gx, gh = _affine(x, h, w_ih, w_hh, b_ih, b_hh)
    i, f, g, o = np.split(gx + gh, 4, axis=-1)  # PyTorch's gate order
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    gx, gh = _affine(x, h, w_ih, w_hh, b_ih, b_hh)
    xr, xz, xn = np.split(gx, 3, axis=-1)
    hr, hz, hn_ = np.split(gh, 3, axis=-1)
    r = sigmoid(xr + hr)
    z = sigmoid(xz + hz)
    n = np.tanh(xn + r * hn_)  # r multiplies (W_hn h + b_hn), as in PyTorch
    return (1 - z) * n + z * h


def rnn_sequence(mode, x, params, num_layers=1, bidirectional=False, h0=None, c0=None,
                 hidden_size=None, nonlinearity="tanh"):
    """Reference RNN/LSTM/GRU over x (seq, batch, feature), params by PyTorch name.

    Returns (output (seq, batch, dirs*hidden), h_n, c_n or None).
    """
    steps, batch = x.shape[0], x.shape[1]
    dirs = 2 if bidirectional else 1
    if h0 is None:
        h0 = np.zeros((num_layers * dirs, batch, hidden_size))
    if mode == "LSTM" and c0 is None:
        c0 = np.zeros_like(h0)
    h_n, c_n = [], []
    layer_in = x
    for layer in range(num_layers):
        outs = []
        for d, suffix in enumerate(("", "_reverse")[:dirs]):
            w = [params.get(f"{k}_l{layer}{suffix}") for k in
                 ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            k = layer * dirs + d
            h = h0[k]
            c = c0[k] if mode == "LSTM" else None
            out = np.zeros((steps, batch, h.shape[-1]))
            for t in (range(steps - 1, -1, -1) if d else range(steps)):
                if mode == "LSTM":
                    h, c = lstm_cell(layer_in[t], h, c, *w)
                elif mode == "GRU":
                    h = gru_cell(layer_in[t], h, *w)
                else:
                    h = rnn_cell(layer_in[t], h, *w, nonlinearity=nonlinearity)
                out[t] = h
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        layer_in = np.concatenate(outs, axis=-1)
    return layer_in, np.stack(h_n), (np.stack(c_n) if mode == "LSTM" else None)


# ---- losses ---------------------------------------------------------------------------------


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _rows(logits, target):
    """(N, C, d...) -> (M, C) and (M,); 1-D (C,) -> (1, C) and (1,)."""
    if logits.ndim == 1:
        return logits[None, :], np.reshape(target, (1,))
    if logits.ndim > 2:
        c = logits.shape[1]
        return np.moveaxis(logits, 1, -1).reshape(-1, c), target.reshape(-1)
    return logits, target


def nll_loss(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    rows, tgt = _rows(logp, target)
    c = rows.shape[1]
    w = np.ones(c) if weight is None else weight
    valid = tgt != ignore_index
    safe = np.where(valid, tgt, 0)
    row_w = np.where(valid, w[safe], 0.0)
    losses = -rows[np.arange(len(tgt)), safe] * row_w
    if reduction == "mean":
        return losses.sum() / row_w.sum()
    if reduction == "sum":
        return losses.sum()
    return losses.reshape(np.shape(target))


def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    class_dim = 0 if logits.ndim == 1 else 1
    logp = log_softmax(logits, class_dim)
    loss = nll_loss(logp, target, weight, ignore_index, reduction)
    if not label_smoothing:
        return loss
    rows, tgt = _rows(logp, target)
    c = rows.shape[1]
    valid = tgt != ignore_index
    smooth = np.where(valid, -rows.sum(axis=1) / c, 0.0)
    if reduction == "mean":
        smooth = smooth.sum() / valid.sum()
    elif reduction == "sum":
        smooth = smooth.sum()
    else:
        smooth = smooth.reshape(np.shape(target))
    return (1 - label_smoothing) * loss + label_smoothing * smooth


def bce_with_logits(x, y, weight=None, reduction="mean", pos_weight=None):
    # log(1 + exp(-x)) computed stably, then the textbook formula
    log_sig = -np.logaddexp(0.0, -x)       # log sigmoid(x)
    log_one_minus = -np.logaddexp(0.0, x)  # log (1 - sigmoid(x))
    pw = 1.0 if pos_weight is None else pos_weight
    loss = -(pw * y * log_sig + (1 - y) * log_one_minus)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# ---- optimizers (PyTorch's update rules, one list of arrays at a time) ------------------


class SGDRef:
    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False):
        self.params, self.lr, self.mom, self.damp = params, lr, momentum, dampening
        self.wd, self.nesterov, self.maximize = weight_decay, nesterov, maximize
        self.buf = [None] * len(params)

    def step(self, grads):
        for i, (p, g) in enumerate(zip(self.params, grads)):
            d = -g if self.maximize else g.copy()
            if self.wd:
                d = d + self.wd * p
            if self.mom:
                if self.buf[i] is None:
                    self.buf[i] = d.copy()
                else:
                    self.buf[i] = self.mom * self.buf[i] + (1 - self.damp) * d
                d = d + self.mom * self.buf[i] if self.nesterov else self.buf[i]
            p -= self.lr * d


class AdamRef:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, maximize=False, decoupled=False):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.wd, self.amsgrad, self.maximize, self.decoupled = (weight_decay, amsgrad,
                                                                maximize, decoupled)
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.vmax = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads):
        self.t += 1
        b1, b2 = self.betas
        for i, (p, g) in enumerate(zip(self.params, grads)):
            g = -g if self.maximize else g
            if self.wd and self.decoupled:
                p *= 1 - self.lr * self.wd
            elif self.wd:
                g = g + self.wd * p
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
            m_hat = self.m[i] / (1 - b1 ** self.t)
            second = self.v[i]
            if self.amsgrad:
                self.vmax[i] = np.maximum(self.vmax[i], self.v[i])
                second = self.vmax[i]
            p -= self.lr * m_hat / (np.sqrt(second / (1 - b2 ** self.t)) + self.eps)
