"""RNNCell/LSTMCell/GRUCell and RNN/LSTM/GRU against hand-written NumPy references."""

import importlib.util
import math

import numpy as np
import pytest
from nn_refs import gru_cell, lstm_cell, np_of, rnn_cell, rnn_sequence

import hybridnet as hn

nn = hn.nn
f64 = hn.float64
TOL = dict(rtol=1e-10, atol=1e-12)
IN, HID = 3, 5


def _params(module):
    return {name: np_of(p) for name, p in module.named_parameters()}


def _t(a):
    return hn.tensor(np.asarray(a, dtype=np.float64))


# ---- cells -----------------------------------------------------------------------------------

CELLS = [
    ("RNNCell", dict(nonlinearity="tanh")),
    ("RNNCell", dict(nonlinearity="relu")),
    ("RNNCell", dict(bias=False)),
    ("LSTMCell", {}),
    ("LSTMCell", dict(bias=False)),
    ("GRUCell", {}),
    ("GRUCell", dict(bias=False)),
]


def _cell_ref(kind, kwargs, p, x, h, c):
    w = (p["weight_ih"], p["weight_hh"], p.get("bias_ih"), p.get("bias_hh"))
    if kind == "LSTMCell":
        return lstm_cell(x, h, c, *w)
    if kind == "GRUCell":
        return gru_cell(x, h, *w)
    return rnn_cell(x, h, *w, nonlinearity=kwargs.get("nonlinearity", "tanh"))


@pytest.mark.parametrize("kind, kwargs", CELLS, ids=[f"{k}-{v}" for k, v in CELLS])
@pytest.mark.parametrize("given_state", [False, True])
def test_cells_vs_numpy(kind, kwargs, given_state):
    rng = np.random.default_rng(0)
    cell = getattr(nn, kind)(IN, HID, dtype=f64, **kwargs)
    gates = {"RNNCell": 1, "LSTMCell": 4, "GRUCell": 3}[kind]
    bias = kwargs.get("bias", True)
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if bias else [])
    assert [n for n, _ in cell.named_parameters()] == names
    assert cell.weight_ih.shape == (gates * HID, IN) and cell.weight_hh.shape == (gates * HID, HID)
    p = _params(cell)
    x = rng.standard_normal((4, IN))
    h = rng.standard_normal((4, HID)) if given_state else np.zeros((4, HID))
    c = rng.standard_normal((4, HID)) if given_state else np.zeros((4, HID))
    ref = _cell_ref(kind, kwargs, p, x, h, c)
    if kind == "LSTMCell":
        out = cell(_t(x), (_t(h), _t(c)) if given_state else None)
        np.testing.assert_allclose(np_of(out[0]), ref[0], **TOL)
        np.testing.assert_allclose(np_of(out[1]), ref[1], **TOL)
        unb = cell(_t(x[1]), (_t(h[1]), _t(c[1])) if given_state else None)
        assert unb[0].shape == (HID,) and unb[1].shape == (HID,)
        np.testing.assert_allclose(np_of(unb[0]), ref[0][1], **TOL)
    else:
        out = cell(_t(x), _t(h) if given_state else None)
        assert out.shape == (4, HID)
        np.testing.assert_allclose(np_of(out), ref, **TOL)
        unb = cell(_t(x[2]), _t(h[2]) if given_state else None)  # unbatched
        assert unb.shape == (HID,)
        np.testing.assert_allclose(np_of(unb), ref[2], **TOL)


def test_cell_errors_and_init_bounds():
    hn.manual_seed(0)
    cell = nn.LSTMCell(4, 16)
    bound = 1 / math.sqrt(16)
    for name, p in cell.named_parameters():
        a = np_of(p)
        assert np.abs(a).max() <= bound and np.abs(a).max() > 0.9 * bound, name
    with pytest.raises(hn.ShapeError, match="LSTMCell"):
        cell(hn.zeros(2, 5))
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNNCell(2, 2, nonlinearity="sigmoid")


# ---- sequence layers ------------------------------------------------------------------------

# (num_layers, bidirectional, batch_first, give initial state, bias)
CONFIGS = [(1, False, False, False, True), (2, False, True, True, True),
           (1, True, True, False, True), (2, True, False, True, True),
           (2, True, True, True, False)]
MODES = ["RNN", "LSTM", "GRU"]


def _make(mode, layers, bidir, batch_first, bias=True, **kw):
    return getattr(nn, mode)(IN, HID, num_layers=layers, bidirectional=bidir,
                             batch_first=batch_first, bias=bias, dtype=f64, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seq_len", [1, 5, 17])
@pytest.mark.parametrize("config", CONFIGS,
                         ids=lambda c: "L{}-bi{:d}-bf{:d}-h0{:d}-b{:d}".format(*c))
def test_sequence_layers_vs_numpy(mode, seq_len, config):
    layers, bidir, batch_first, given, bias = config
    rng = np.random.default_rng(seq_len)
    rnn = _make(mode, layers, bidir, batch_first, bias)
    dirs = 2 if bidir else 1
    batch = 3
    x = rng.standard_normal((seq_len, batch, IN))  # reference layout (seq, batch, feature)
    h0 = rng.standard_normal((layers * dirs, batch, HID)) if given else None
    c0 = rng.standard_normal((layers * dirs, batch, HID)) if given else None
    ref_out, ref_h, ref_c = rnn_sequence(mode, x, _params(rnn), layers, bidir, h0, c0, HID)
    xin = _t(x.transpose(1, 0, 2) if batch_first else x)
    if mode == "LSTM":
        out, (h_n, c_n) = rnn(xin, (_t(h0), _t(c0)) if given else None)
        np.testing.assert_allclose(np_of(c_n), ref_c, **TOL)
    else:
        out, h_n = rnn(xin, _t(h0) if given else None)
    if batch_first:
        assert out.shape == (batch, seq_len, dirs * HID)
        out_sb = np_of(out).transpose(1, 0, 2)
    else:
        out_sb = np_of(out)
    assert h_n.shape == (layers * dirs, batch, HID)
    np.testing.assert_allclose(out_sb, ref_out, **TOL)
    np.testing.assert_allclose(np_of(h_n), ref_h, **TOL)
    # the last layer's final forward state is the last output step
    np.testing.assert_allclose(np_of(h_n)[(layers - 1) * dirs], ref_out[-1, :, :HID], **TOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("given", [False, True])
def test_unbatched_input(mode, given):
    rng = np.random.default_rng(7)
    rnn = _make(mode, 2, True, False)
    x = rng.standard_normal((6, IN))
    h0 = rng.standard_normal((4, HID)) if given else None
    c0 = rng.standard_normal((4, HID)) if given else None
    ref_out, ref_h, ref_c = rnn_sequence(
        mode, x[:, None, :], _params(rnn), 2, True,
        None if h0 is None else h0[:, None], None if c0 is None else c0[:, None], HID)
    if mode == "LSTM":
        out, (h_n, c_n) = rnn(_t(x), (_t(h0), _t(c0)) if given else None)
        assert c_n.shape == (4, HID)
        np.testing.assert_allclose(np_of(c_n), ref_c[:, 0], **TOL)
    else:
        out, h_n = rnn(_t(x), _t(h0) if given else None)
    assert out.shape == (6, 2 * HID) and h_n.shape == (4, HID)
    np.testing.assert_allclose(np_of(out), ref_out[:, 0], **TOL)
    np.testing.assert_allclose(np_of(h_n), ref_h[:, 0], **TOL)


def test_relu_rnn_vs_numpy():
    rng = np.random.default_rng(9)
    rnn = nn.RNN(IN, HID, num_layers=2, nonlinearity="relu", dtype=f64)
    x = rng.standard_normal((8, 2, IN))
    ref_out, ref_h, _ = rnn_sequence("RNN", x, _params(rnn), 2, False, hidden_size=HID,
                                     nonlinearity="relu")
    out, h_n = rnn(_t(x))
    assert (np_of(out) == 0).any()  # relu really clips
    np.testing.assert_allclose(np_of(out), ref_out, **TOL)
    np.testing.assert_allclose(np_of(h_n), ref_h, **TOL)


@pytest.mark.parametrize("mode, gates", [("RNN", 1), ("LSTM", 4), ("GRU", 3)])
def test_parameter_names_shapes_and_init(mode, gates):
    hn.manual_seed(2)
    rnn = getattr(nn, mode)(4, 8, num_layers=2, bidirectional=True)
    names, expected = [n for n, _ in rnn.named_parameters()], []
    for layer in range(2):
        for suffix in ("", "_reverse"):
            expected += [f"{k}_l{layer}{suffix}" for k in
                         ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    assert names == expected
    assert list(rnn.state_dict()) == expected
    assert rnn.weight_ih_l0.shape == (gates * 8, 4)
    assert rnn.weight_ih_l1_reverse.shape == (gates * 8, 16)  # layer 1 sees both directions
    assert rnn.weight_hh_l1.shape == (gates * 8, 8) and rnn.bias_hh_l0_reverse.shape == (gates * 8,)
    bound = 1 / math.sqrt(8)
    for name, p in rnn.named_parameters():
        assert np.abs(np_of(p)).max() <= bound, name
    no_bias = getattr(nn, mode)(4, 8, bias=False)
    assert [n for n, _ in no_bias.named_parameters()] == ["weight_ih_l0", "weight_hh_l0"]


def test_dropout_between_layers_only_in_training():
    rng = np.random.default_rng(3)
    hn.manual_seed(0)
    lstm = nn.LSTM(IN, HID, num_layers=2, dropout=0.5, dtype=f64)
    x = _t(rng.standard_normal((4, 2, IN)))
    ref_out, _, _ = rnn_sequence("LSTM", np_of(x), _params(lstm), 2, hidden_size=HID)
    train_out, _ = lstm(x)
    assert not np.allclose(np_of(train_out), ref_out)
    lstm.eval()
    eval_out, _ = lstm(x)
    np.testing.assert_allclose(np_of(eval_out), ref_out, **TOL)


def test_sequence_errors():
    lstm = nn.LSTM(IN, HID, num_layers=2)
    with pytest.raises(hn.ShapeError, match="feature"):
        lstm(hn.zeros(5, 2, IN + 1))
    with pytest.raises(hn.ShapeError, match="hidden state"):
        lstm(hn.zeros(5, 2, IN), (hn.zeros(1, 2, HID), hn.zeros(2, 2, HID)))
    with pytest.raises(ValueError, match="num_layers"):
        nn.GRU(IN, HID, num_layers=0)


# ---- gradients vs central finite differences -------------------------------------------


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_gradients_vs_finite_differences(mode):
    rng = np.random.default_rng(4)
    hn.manual_seed(4)
    rnn = getattr(nn, mode)(2, 3, num_layers=2, bidirectional=True, batch_first=True,
                            dtype=f64)
    x = hn.tensor(rng.standard_normal((2, 4, 2)), requires_grad=True)

    def loss():
        out, _ = rnn(x)
        return out.sum()

    loss().backward()
    targets = [("input", x)] + list(rnn.named_parameters())
    checked = 0
    for name, t in targets:
        grad = np_of(t.grad)
        for _ in range(2):  # a couple of random entries of each tensor
            index = tuple(int(rng.integers(0, s)) for s in t.shape)
            old = float(np_of(t)[index])
            vals = []
            for v in (old + 1e-6, old - 1e-6):
                with hn.no_grad():
                    t[index] = v
                    vals.append(float(loss().item()))
            with hn.no_grad():
                t[index] = old
            fd = (vals[0] - vals[1]) / 2e-6
            assert abs(grad[index] - fd) < 1e-6 + 1e-5 * abs(fd), (name, index, grad[index], fd)
            checked += 1
    assert checked == 2 * (1 + 16)
    assert np.abs(np_of(rnn.weight_hh_l1_reverse.grad)).sum() > 0


# ---- the dedicated comparison with PyTorch -------------------------------------------------


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"])
def test_against_torch(kind):
    import torch
    rng = np.random.default_rng(12)
    cell = kind.endswith("Cell")
    if cell:
        ours = getattr(nn, kind)(IN, HID, dtype=f64)
        theirs = getattr(torch.nn, kind)(IN, HID).double()
    else:
        kw = dict(num_layers=2, bidirectional=True, batch_first=True)
        ours = getattr(nn, kind)(IN, HID, dtype=f64, **kw)
        theirs = getattr(torch.nn, kind)(IN, HID, **kw).double()
    their_names = [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters()] == their_names
    with torch.no_grad():
        for name, p in ours.named_parameters():
            getattr(theirs, name).copy_(torch.from_numpy(np_of(p)))
    x = rng.standard_normal((4, IN) if cell else (3, 9, IN))
    state_shape = (4, HID) if cell else (4, 3, HID)
    h0, c0 = rng.standard_normal(state_shape), rng.standard_normal(state_shape)
    tx, th, tc = (torch.from_numpy(a) for a in (x, h0, c0))
    if kind.startswith("LSTM"):
        mine = ours(_t(x), (_t(h0), _t(c0)))
        ref = theirs(tx, (th, tc))
    else:
        mine = ours(_t(x), _t(h0))
        ref = theirs(tx, th)
    flat_mine = [mine] if cell and kind != "LSTMCell" else list(mine)
    flat_ref = [ref] if cell and kind != "LSTMCell" else list(ref)
    if kind == "LSTM":  # (out, (h, c))
        flat_mine = [flat_mine[0], *flat_mine[1]]
        flat_ref = [flat_ref[0], *flat_ref[1]]
    assert len(flat_mine) == len(flat_ref)
    for a, b in zip(flat_mine, flat_ref):
        np.testing.assert_allclose(np_of(a), b.detach().numpy(), rtol=1e-10, atol=1e-12)
    # gradients of the sum of the first output agree too
    flat_mine[0].sum().backward()
    flat_ref[0].sum().backward()
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(np_of(p.grad), getattr(theirs, name).grad.numpy(),
                                   rtol=1e-9, atol=1e-11, err_msg=name)


if importlib.util.find_spec("torch") is None:  # compared with PyTorch only where it is installed
    del test_against_torch
