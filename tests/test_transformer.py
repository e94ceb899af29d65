"""MultiheadAttention, TransformerEncoderLayer and TransformerEncoder
(hybridnet.nn.transformer) against PyTorch, then under `hn.trace`.

Each module is built in both libraries with the same arguments; the state dicts must
have the same keys and shapes, torch's weights are loaded into the hybridnet module,
and outputs, attention weights, input gradients and parameter gradients must agree
(masks bool and float, batch_first both ways, kdim/vdim, add_bias_kv, add_zero_attn,
norm_first, gelu; dropout 0 or eval mode, so both are deterministic). Initialisation
follows PyTorch's. The JIT part: a TransformerEncoder forward under no_grad, traced
once, runs compiled, equals eager and fuses the masking into the softmax kernel.
"""

import warnings

import numpy as np
import pytest
import torch

import hybridnet as hn
from hybridnet.nn.transformer import generate_square_subsequent_mask

RTOL, ATOL = 1e-5, 1e-5  # float32 against torch's float32
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5


def _np(t):
    return t.detach().numpy().copy()


def _load_from_torch(hmod, tmod):
    """Same state_dict keys and shapes in both; torch's values copied into hmod."""
    hsd, tsd = hmod.state_dict(), tmod.state_dict()
    assert list(hsd) == list(tsd)
    for k in tsd:
        assert tuple(hsd[k].shape) == tuple(tsd[k].shape), k
    result = hmod.load_state_dict({k: v.numpy() for k, v in tsd.items()})
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []


def _randomize_biases(tmod, rng):
    """Give torch's zero-initialised biases (and the LayerNorms) other values."""
    with torch.no_grad():
        for name, p in tmod.named_parameters():
            if p.ndim == 1 or "bias_" in name:
                p.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, p.shape).astype(np.float32))
                        + (1.0 if name.endswith("norm1.weight") or name.endswith("norm2.weight")
                           or name == "norm.weight" else 0.0))


def _pair(arr, grad=True):
    return (hn.tensor(arr, requires_grad=grad), torch.tensor(arr, requires_grad=grad))


def _check_grads(hmod, tmod, pairs, tol_scale=1.0):
    tparams = dict(tmod.named_parameters())
    for name, p in hmod.named_parameters():
        assert p.grad is not None, name
        np.testing.assert_allclose(_np(p.grad), tparams[name].grad.numpy(),
                                   rtol=GRAD_RTOL * tol_scale, atol=GRAD_ATOL * tol_scale,
                                   err_msg=name)
    for i, (h, t) in enumerate(pairs):
        if t.requires_grad:
            np.testing.assert_allclose(_np(h.grad), t.grad.numpy(), rtol=GRAD_RTOL * tol_scale,
                                       atol=GRAD_ATOL * tol_scale, err_msg=f"input {i}")


# ---- MultiheadAttention -------------------------------------------------------------------

E, H, L, S, N = 8, 2, 4, 5, 3
MHA_CONFIGS = {
    "default": dict(),
    "batch_first": dict(batch_first=True),
    "kdim-vdim": dict(kdim=3, vdim=6),
    "no-bias": dict(bias=False),
    "bias-kv": dict(add_bias_kv=True),
    "zero-attn": dict(add_zero_attn=True),
    "bias-kv-zero-attn-batch-first": dict(add_bias_kv=True, add_zero_attn=True,
                                          batch_first=True),
}


def _masks(kind, rng, tgt_len, src_len):
    """(key_padding_mask, attn_mask) as NumPy arrays, or None (batch N, H heads)."""
    if kind == "none":
        return None, None
    if kind == "bool":
        kpm = np.zeros((N, src_len), bool)
        kpm[0, -2:] = True
        kpm[2, 0] = True
        return kpm, np.triu(np.ones((tgt_len, src_len), bool), 2)
    kpm = np.where(rng.uniform(size=(N, src_len)) < 0.3, -np.inf, 0.0).astype(np.float32)
    kpm[:, 0] = 0.0  # no row masked entirely
    return kpm, rng.standard_normal((N * H, tgt_len, src_len)).astype(np.float32)  # float: added


def _both(arr):
    return (None, None) if arr is None else (hn.tensor(arr), torch.tensor(arr))


@pytest.mark.parametrize("masks", ["none", "bool", "float"])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("config", list(MHA_CONFIGS))
def test_multihead_attention_matches_torch(config, need_weights, masks):
    kw = MHA_CONFIGS[config]
    rng = np.random.default_rng(len(config) + 7 * need_weights)
    torch.manual_seed(0)
    tm, hm = torch.nn.MultiheadAttention(E, H, **kw), hn.nn.MultiheadAttention(E, H, **kw)
    _randomize_biases(tm, rng)
    _load_from_torch(hm, tm)
    bf = kw.get("batch_first", False)

    def arr(length, dim):
        return rng.standard_normal((N, length, dim) if bf else (length, N, dim)).astype(
            np.float32)

    q, k, v = _pair(arr(L, E)), _pair(arr(S, kw.get("kdim", E))), _pair(arr(S, kw.get("vdim", E)))
    kpm, am = _masks(masks, rng, L, S)
    (hk, tk), (ha, ta) = _both(kpm), _both(am)
    hout, hw = hm(q[0], k[0], v[0], key_padding_mask=hk, need_weights=need_weights, attn_mask=ha)
    tout, tw = tm(q[1], k[1], v[1], key_padding_mask=tk, need_weights=need_weights, attn_mask=ta)
    np.testing.assert_allclose(_np(hout), _np(tout), rtol=RTOL, atol=ATOL)
    if need_weights:
        assert hw.shape == tuple(tw.shape) == (N, L, S + kw.get("add_bias_kv", 0)
                                               + kw.get("add_zero_attn", 0))
        np.testing.assert_allclose(_np(hw), _np(tw), rtol=RTOL, atol=ATOL)
    else:
        assert hw is None and tw is None
    g = rng.standard_normal(tout.shape).astype(np.float32)
    (hout * hn.tensor(g)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    _check_grads(hm, tm, [q, k, v])


@pytest.mark.parametrize("case", ["self-attention", "unbatched", "per-head-weights",
                                  "causal-hint", "float64"])
def test_multihead_attention_more_cases_match_torch(case):
    rng = np.random.default_rng(3)
    torch.manual_seed(1)
    dtype = torch.float64 if case == "float64" else torch.float32
    tm = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=dtype)
    hm = hn.nn.MultiheadAttention(E, H, batch_first=True,
                                  dtype=hn.float64 if case == "float64" else None)
    _randomize_biases(tm, rng)
    _load_from_torch(hm, tm)
    shape = (L, E) if case == "unbatched" else (N, L, E)
    x = _pair(rng.standard_normal(shape).astype(str(dtype).split(".")[-1]))
    kw = dict(need_weights=True)
    if case == "per-head-weights":
        kw["average_attn_weights"] = False
    if case == "causal-hint":  # need_weights=False: torch takes the causal SDPA path
        kw = dict(need_weights=False, is_causal=True, attn_mask=np.triu(np.ones((L, L), bool), 1))
    if case == "unbatched":
        kw.update(key_padding_mask=np.array([0.0, 0.0, -np.inf, 0.0], np.float32),
                  attn_mask=rng.standard_normal((H, L, L)).astype(np.float32))
    hkw = {k: hn.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    hout, hw = hm(x[0], x[0], x[0], **hkw)
    tout, tw = tm(x[1], x[1], x[1], **tkw)
    np.testing.assert_allclose(_np(hout), _np(tout), rtol=RTOL, atol=ATOL)
    if tw is not None:
        assert hw.shape == tuple(tw.shape)
        np.testing.assert_allclose(_np(hw), _np(tw), rtol=RTOL, atol=ATOL)
    hout.sum().backward()
    tout.sum().backward()
    _check_grads(hm, tm, [x])


def test_multihead_attention_fully_masked_rows_as_torch():
    """A query whose keys are all masked: nan with need_weights (softmax of -inf), zeros
    without (PyTorch's scaled_dot_product_attention), as in torch."""
    torch.manual_seed(2)
    tm, hm = torch.nn.MultiheadAttention(E, H), hn.nn.MultiheadAttention(E, H)
    _load_from_torch(hm, tm)
    x = np.random.default_rng(4).standard_normal((S, N, E)).astype(np.float32)
    kpm = np.zeros((N, S), bool)
    kpm[1] = True
    for need_weights in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy: -inf - -inf
            hout = hm(*[hn.tensor(x)] * 3, key_padding_mask=hn.tensor(kpm),
                      need_weights=need_weights)[0]
        tout = tm(*[torch.tensor(x)] * 3, key_padding_mask=torch.tensor(kpm),
                  need_weights=need_weights)[0]
        np.testing.assert_allclose(_np(hout), _np(tout), rtol=RTOL, atol=ATOL)
        assert np.isnan(_np(hout)[:, 1]).all() == need_weights


def test_multihead_attention_parameters_and_init_follow_torch():
    for kw in [dict(), dict(kdim=3, vdim=5), dict(bias=False), dict(add_bias_kv=True)]:
        tm, hm = torch.nn.MultiheadAttention(16, 4, **kw), hn.nn.MultiheadAttention(16, 4, **kw)
        assert [n for n, _ in hm.named_parameters()] == [n for n, _ in tm.named_parameters()]
        assert list(hm.state_dict()) == list(tm.state_dict())
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                     "in_proj_bias", "bias_k", "bias_v"):
            assert (getattr(hm, name) is None) == (getattr(tm, name) is None), (kw, name)
        assert hm._qkv_same_embed_dim == tm._qkv_same_embed_dim
        assert (hm.head_dim, hm.kdim, hm.vdim, hm.batch_first) == (tm.head_dim, tm.kdim,
                                                                    tm.vdim, tm.batch_first)
    hn.manual_seed(0)
    hm = hn.nn.MultiheadAttention(64, 4)
    w = _np(hm.in_proj_weight)
    bound = np.sqrt(6.0 / (64 + 3 * 64))  # xavier_uniform_ over (3E, E)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.03 * bound
    assert not _np(hm.in_proj_bias).any() and not _np(hm.out_proj.bias).any()
    ob = 1 / np.sqrt(64)  # out_proj keeps Linear's weight init
    assert ob * 0.95 < np.abs(_np(hm.out_proj.weight)).max() <= ob


def test_multihead_attention_errors():
    m = hn.nn.MultiheadAttention(E, H)
    x = hn.randn(L, N, E)
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        hn.nn.MultiheadAttention(8, 3)
    with pytest.raises(hn.ShapeError, match="expecting embedding dimension of 8"):
        m(hn.randn(L, N, 6), hn.randn(L, N, 6), hn.randn(L, N, 6))
    with pytest.raises(hn.ShapeError, match=r"2D attn_mask is \[4, 3\], but should be \[4, 4\]"):
        m(x, x, x, attn_mask=hn.zeros(4, 3))
    with pytest.raises(hn.ShapeError, match=r"3D attn_mask is \[2, 4, 4\], but should be "
                                            r"\[6, 4, 4\]"):
        m(x, x, x, attn_mask=hn.zeros(2, 4, 4))
    with pytest.raises(hn.ShapeError, match=r"key_padding_mask of shape \[3, 4\]"):
        m(x, x, x, key_padding_mask=hn.zeros(3, 5, dtype=hn.bool))
    with pytest.raises(hn.DTypeError, match="only bool and floating types of attn_mask"):
        m(x, x, x, attn_mask=hn.zeros(4, 4, dtype=hn.int64))
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        m(x, x, x, is_causal=True)
    with pytest.raises(hn.ShapeError, match="query should be unbatched 2-D or batched 3-D"):
        m(hn.randn(1, L, N, E), x, x)
    with pytest.raises(hn.ShapeError, match="key and value to be 3-D"):
        m(x, hn.randn(L, E), x)
    with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
        m(x, x, x, key_padding_mask=hn.zeros(N, L, dtype=hn.bool), attn_mask=hn.zeros(L, L))


def test_generate_square_subsequent_mask_matches_torch():
    want = torch.nn.Transformer.generate_square_subsequent_mask(5).numpy()
    np.testing.assert_array_equal(_np(generate_square_subsequent_mask(5)), want)
    assert generate_square_subsequent_mask(3, dtype=hn.float64).dtype == hn.float64


# ---- TransformerEncoderLayer and TransformerEncoder -----------------------------------------

D, NHEAD, FF = 8, 2, 16
LAYER_CONFIGS = {
    "post-norm-relu": dict(),
    "pre-norm-gelu": dict(norm_first=True, activation="gelu"),
    "batch-first-pre-norm": dict(batch_first=True, norm_first=True),
    "callable-activation": dict(activation="module"),
    "no-bias-eps": dict(bias=False, layer_norm_eps=1e-3),
}


def _layer(m, cfg, dropout=0.0):
    cfg = dict(cfg)
    if cfg.get("activation") == "module":
        cfg["activation"] = m.nn.GELU(approximate="tanh")
    return m.nn.TransformerEncoderLayer(D, NHEAD, FF, dropout=dropout, **cfg)


def _src(rng, cfg, batch=N, seq=S):
    shape = (batch, seq, D) if cfg.get("batch_first") else (seq, batch, D)
    return _pair(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("masks", ["none", "bool", "float"])
@pytest.mark.parametrize("config", list(LAYER_CONFIGS))
def test_encoder_layer_matches_torch(config, masks):
    cfg = LAYER_CONFIGS[config]
    rng = np.random.default_rng(len(config))
    torch.manual_seed(3)
    tl, hl = _layer(torch, cfg), _layer(hn, cfg)
    _randomize_biases(tl, rng)
    _load_from_torch(hl, tl)
    src = _src(rng, cfg)
    kpm, am = _masks(masks, rng, S, S)
    (hk, tk), (ha, ta) = _both(kpm), _both(am)
    hout = hl(src[0], src_mask=ha, src_key_padding_mask=hk)
    tout = tl(src[1], src_mask=ta, src_key_padding_mask=tk)
    np.testing.assert_allclose(_np(hout), _np(tout), rtol=RTOL, atol=ATOL)
    g = rng.standard_normal(tout.shape).astype(np.float32)
    (hout * hn.tensor(g)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    _check_grads(hl, tl, [src])


@pytest.mark.parametrize("case", ["masks-norm", "causal", "eval-dropout", "unbatched"])
def test_encoder_matches_torch(case):
    cfg = dict(batch_first=True, norm_first=True) if case == "causal" else {}
    rng = np.random.default_rng(11)
    torch.manual_seed(4)
    dropout = 0.1 if case == "eval-dropout" else 0.0
    tl, hl = _layer(torch, cfg, dropout), _layer(hn, cfg, dropout)
    with_norm = case in ("masks-norm", "causal")
    tenc = torch.nn.TransformerEncoder(tl, 3, norm=torch.nn.LayerNorm(D) if with_norm else None,
                                       enable_nested_tensor=False)
    henc = hn.nn.TransformerEncoder(hl, 3, norm=hn.nn.LayerNorm(D) if with_norm else None,
                                    enable_nested_tensor=False)
    _randomize_biases(tenc, rng)
    _load_from_torch(henc, tenc)
    if case == "eval-dropout":  # eval with grad enabled: torch takes its ordinary path
        tenc.eval(), henc.eval()
    hkw, tkw = {}, {}
    if case == "masks-norm":
        kpm, am = _masks("bool", rng, S, S)
        hkw = dict(mask=hn.tensor(am), src_key_padding_mask=hn.tensor(kpm))
        tkw = dict(mask=torch.tensor(am), src_key_padding_mask=torch.tensor(kpm))
    elif case == "causal":
        hkw = dict(mask=generate_square_subsequent_mask(S), is_causal=True)
        tkw = dict(mask=torch.nn.Transformer.generate_square_subsequent_mask(S), is_causal=True)
    src = _pair(rng.standard_normal((S, D)).astype(np.float32)) if case == "unbatched" else \
        _src(rng, cfg)
    hout, tout = henc(src[0], **hkw), tenc(src[1], **tkw)
    np.testing.assert_allclose(_np(hout), _np(tout), rtol=RTOL, atol=ATOL)
    hout.sum().backward()
    tout.sum().backward()
    _check_grads(henc, tenc, [src], tol_scale=2.0)


def test_encoder_deep_copies_the_layer_and_names_state_as_torch():
    layer = hn.nn.TransformerEncoderLayer(D, NHEAD, FF)
    enc = hn.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True, mask_check=False)
    tenc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(D, NHEAD, FF), 2,
                                       enable_nested_tensor=False)
    assert list(enc.state_dict()) == list(tenc.state_dict())
    assert enc.layers[0] is not layer and enc.layers[0] is not enc.layers[1]
    w0, w1 = enc.layers[0].self_attn.in_proj_weight, enc.layers[1].self_attn.in_proj_weight
    assert w0 is not w1
    np.testing.assert_array_equal(_np(w0), _np(layer.self_attn.in_proj_weight))
    with hn.no_grad():
        w0.mul_(2.0)
    assert not np.array_equal(_np(w0), _np(w1))  # no shared storage
    assert len(list(enc.parameters())) == 2 * len(list(layer.parameters()))
    assert enc.num_layers == 2 and enc.norm is None
    default = hn.nn.TransformerEncoderLayer(D, NHEAD)
    assert default.linear1.out_features == 2048 and default.dropout.p == 0.1
    assert default.norm1.eps == 1e-5 and not default.norm_first
    assert default.activation_relu_or_gelu == 1
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        hn.nn.TransformerEncoderLayer(D, NHEAD, activation="tanh")


def test_encoder_dropout_is_random_in_training_and_off_in_eval():
    hn.manual_seed(5)
    enc = hn.nn.TransformerEncoder(hn.nn.TransformerEncoderLayer(D, NHEAD, FF, dropout=0.5), 2)
    x = hn.randn(S, N, D)
    assert not np.allclose(_np(enc(x)), _np(enc(x)))
    enc.eval()
    np.testing.assert_array_equal(_np(enc(x)), _np(enc(x)))


def test_encoder_training_steps_match_torch():
    """Three SGD steps of a small encoder + head on both libraries."""
    rng = np.random.default_rng(12)
    torch.manual_seed(6)
    models = []
    for m in (torch, hn):
        layer = m.nn.TransformerEncoderLayer(D, NHEAD, FF, dropout=0.0, batch_first=True)
        models.append(m.nn.Sequential(m.nn.TransformerEncoder(layer, 2,
                                                              enable_nested_tensor=False),
                                      m.nn.Flatten(), m.nn.Linear(S * D, 1)))
    tmodel, hmodel = models
    _load_from_torch(hmodel, tmodel)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.05, momentum=0.9)
    hopt = hn.optim.SGD(hmodel.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        x = rng.standard_normal((N, S, D)).astype(np.float32)
        y = rng.uniform(0, 1, (N, 1)).astype(np.float32)
        for model, opt, m, F in ((tmodel, topt, torch, torch.nn.functional),
                                 (hmodel, hopt, hn, hn.nn.functional)):
            opt.zero_grad()
            F.binary_cross_entropy(m.sigmoid(model(m.tensor(x))), m.tensor(y)).backward()
            opt.step()
    tsd = tmodel.state_dict()
    for k, v in hmodel.state_dict().items():
        np.testing.assert_allclose(_np(v), tsd[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


# ---- under hn.trace ------------------------------------------------------------------------


def test_traced_encoder_forward_compiles_and_equals_eager():
    hn.manual_seed(7)
    layer = hn.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, activation="gelu")
    enc = hn.nn.TransformerEncoder(layer, 2, norm=hn.nn.LayerNorm(16)).eval()
    traced = hn.trace(enc)
    rng = np.random.default_rng(13)
    mask = hn.tensor(np.triu(np.ones((6, 6), bool), 1))
    calls = 4
    with hn.no_grad():
        for i in range(calls):
            kpm = np.zeros((2, 6), bool)
            kpm[1, 6 - 1 - i % 3:] = True  # values change, shapes do not
            x = hn.tensor(rng.standard_normal((2, 6, 16)).astype(np.float32))
            got = traced(x, mask=mask, src_key_padding_mask=hn.tensor(kpm))
            want = enc(x, mask=mask, src_key_padding_mask=hn.tensor(kpm))
            assert got.shape == (2, 6, 16) and got.dtype == hn.float32
            np.testing.assert_allclose(_np(got), _np(want), rtol=1e-5, atol=1e-5,
                                       err_msg=f"call {i}: compiled vs eager")
        stats = traced.stats
        assert stats.compiled_calls == calls - 1, (str(stats), stats.events)
        assert stats.compiles + stats.kernel_reuses == 1 and stats.fallbacks == 0, stats.events
    (spec,) = hn.explain(traced).to_dict()["specializations"]  # (reported, not called)
    (trace_info,) = spec["traces"]
    assert not spec["fallback"] and not trace_info["backend_fallback"]
    # per layer, one kernel holds both masks' `where`s and the whole softmax
    fused = [k for k in trace_info["kernels"] if "where, where" in k and "exp" in k
             and "div" in k]
    assert len(fused) == 2, trace_info["kernels"]
