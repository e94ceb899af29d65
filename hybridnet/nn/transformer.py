"""Attention and the Transformer encoder: `MultiheadAttention`, `TransformerEncoderLayer`,
`TransformerEncoder` (and `Dropout2d`), with PyTorch's signatures, parameter names,
initialisation and semantics, so a torch model's state_dict loads into them.

Attention is written with matmul, softmax and `where` (bool masks) or `+` (float
masks) on (batch, heads, L, S) tensors, so under `hn.trace` the masking and the
softmax fuse into elementwise kernels around the matrix products.
"""

import copy
import math
import warnings

import numpy as np

from compiler.errors import DTypeError, ShapeError

from .. import functional as _f
from ..creation import empty
from ..dtypes import to_np
from ..functional import where
from ..shape import broadcast_to, cat, split
from ..tensor import literal
from . import functional as F
from . import init
from .layers import Dropout, LayerNorm, Linear
from .losses import dropout2d
from .module import Module, ModuleList
from .parameter import Parameter

_NEG_INF = float("-inf")


def _desc(t) -> str:
    return f"{t.dtype}{list(t.shape)}"


def generate_square_subsequent_mask(sz: int, dtype=None):
    """The (sz, sz) float causal mask: -inf above the diagonal, 0 elsewhere (as
    nn.Transformer.generate_square_subsequent_mask)."""
    arr = np.triu(np.full((sz, sz), _NEG_INF), 1)
    return literal(arr.astype(np.float32 if dtype is None else to_np(dtype)))


# ---- masks ------------------------------------------------------------------------------


def _canonical_mask(mask, name, query):
    """Check a mask's dtype (bool: True = masked out; float: added to the scores). Bool
    masks stay bool (applied with `where`); float masks take the query's dtype."""
    if mask is None:
        return None
    kind = mask._data.dtype.kind
    if kind not in "bf":
        raise DTypeError(f"only bool and floating types of {name} are supported, got "
                         f"{_desc(mask)}")
    return mask if kind == "b" else mask.to(query.dtype)


def _canonical_masks(padding_mask, padding_name, attn_mask, attn_name, query):
    """Both masks canonical. PyTorch warns when their dtypes differ; then the bool one
    becomes a float mask (-inf where True), so inner layers see one type and stay quiet."""
    if padding_mask is not None and attn_mask is not None and (
            padding_mask._data.dtype != attn_mask._data.dtype):
        warnings.warn(f"Support for mismatched {padding_name} and {attn_name} is "
                      "deprecated. Use same type for both instead.", stacklevel=3)
        padding_mask, attn_mask = (_as_float_mask(m, query) for m in (padding_mask, attn_mask))
    return (_canonical_mask(padding_mask, padding_name, query),
            _canonical_mask(attn_mask, attn_name, query))


def _as_float_mask(mask, query):
    if mask._data.dtype.kind != "b":
        return mask
    return where(mask, _NEG_INF, literal(np.zeros((), query._data.dtype)))


def _apply_mask(scores, mask):
    if mask is None:
        return scores
    if mask._data.dtype.kind == "b":
        return where(mask, _NEG_INF, scores)
    return scores + mask


def _pad_last(mask):
    """Append one unmasked column (False or 0) to a mask."""
    zeros = literal(np.zeros(mask.shape[:-1] + (1,), mask._data.dtype))
    return cat([mask, zeros], -1)


def _safe_softmax(scores):
    """softmax over the last dim, giving 0 (not nan) for rows masked entirely, as
    PyTorch's scaled_dot_product_attention does."""
    m = _f.amax(scores.detach(), -1, keepdim=True)
    e = _f.exp(scores - where(m > _NEG_INF, m, 0.0))
    total = _f.sum(e, -1, keepdim=True)
    return e / where(total > 0.0, total, 1.0)


def _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads) -> bool:
    """PyTorch's _mha_shape_check: is the input batched (3-D) or not (2-D)?"""
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise ShapeError(f"multi_head_attention: for batched (3-D) query, expected key "
                             f"and value to be 3-D, got {_desc(key)} and {_desc(value)}")
        if key_padding_mask is not None and key_padding_mask.ndim != 2:
            raise ShapeError(f"multi_head_attention: for batched (3-D) query, expected "
                             f"key_padding_mask to be None or 2-D, got {_desc(key_padding_mask)}")
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise ShapeError(f"multi_head_attention: for batched (3-D) query, expected "
                             f"attn_mask to be None, 2-D or 3-D, got {_desc(attn_mask)}")
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise ShapeError(f"multi_head_attention: for unbatched (2-D) query, expected key "
                             f"and value to be 2-D, got {_desc(key)} and {_desc(value)}")
        if key_padding_mask is not None and key_padding_mask.ndim != 1:
            raise ShapeError(f"multi_head_attention: for unbatched (2-D) query, expected "
                             f"key_padding_mask to be None or 1-D, got {_desc(key_padding_mask)}")
        if attn_mask is not None:
            expected = (num_heads, query.shape[0], key.shape[0])
            if attn_mask.ndim not in (2, 3) or (attn_mask.ndim == 3
                                                and attn_mask.shape != expected):
                raise ShapeError(f"multi_head_attention: for unbatched (2-D) query, expected "
                                 f"attn_mask of shape {list(expected[1:])} or "
                                 f"{list(expected)}, got {_desc(attn_mask)}")
        return False
    raise ShapeError(f"multi_head_attention: query should be unbatched 2-D or batched 3-D, "
                     f"got {_desc(query)}")


# ---- the attention function -----------------------------------------------------------------


def _in_projection(query, key, value, w, b, w_k=None, w_v=None):
    """q, k, v projections: packed (w is (3E, E), self-attention in one product) or
    separate (w_k and w_v given: w is q's weight, b the packed bias)."""
    E = query.shape[-1]
    if w_k is None:
        if key is value and query is key:
            return split(F.linear(query, w, b), E, -1)
        w, w_k, w_v = split(w, E, 0)
    b_q, b_k, b_v = (None, None, None) if b is None else split(b, E, 0)
    return F.linear(query, w, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)


def multi_head_attention_forward(
        query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
        bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias,
        training=True, key_padding_mask=None, need_weights=True, attn_mask=None,
        use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
        v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
        is_causal=False):
    """torch.nn.functional.multi_head_attention_forward: inputs (L, N, E) or unbatched
    (L, E); returns (output, attention weights (averaged over heads) or None)."""
    batched = _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not batched:
        query, key, value = (t.unsqueeze(1) for t in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    L, N, E = query.shape
    key_padding_mask, attn_mask = _canonical_masks(key_padding_mask, "key_padding_mask",
                                                   attn_mask, "attn_mask", query)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use "
                           "generate_square_subsequent_mask to create this mask.")
    causal = bool(is_causal and key_padding_mask is None and not need_weights)
    attn_mask = None if causal else attn_mask
    if E != embed_dim_to_check:
        raise ShapeError(f"multi_head_attention: was expecting embedding dimension of "
                         f"{embed_dim_to_check}, but got query {_desc(query)}")
    head_dim = E // num_heads
    if head_dim * num_heads != E:
        raise ShapeError(f"multi_head_attention: embed_dim {E} not divisible by num_heads "
                         f"{num_heads}")
    if (key.shape[:2] != value.shape[:2] if use_separate_proj_weight
            else key.shape != value.shape):
        raise ShapeError(f"multi_head_attention: key {_desc(key)} does not match value "
                         f"{_desc(value)}")
    if key.shape[1] != N:
        raise ShapeError(f"multi_head_attention: query {_desc(query)} and key {_desc(key)} "
                         "differ in batch size")
    if use_separate_proj_weight:
        q, k, v = _in_projection(query, key, value, q_proj_weight, in_proj_bias,
                                 k_proj_weight, v_proj_weight)
    else:
        q, k, v = _in_projection(query, key, value, in_proj_weight, in_proj_bias)
    S = key.shape[0]
    if attn_mask is not None:
        want = (L, S) if attn_mask.ndim == 2 else (N * num_heads, L, S)
        if attn_mask.shape != want:
            raise ShapeError(f"The shape of the {attn_mask.ndim}D attn_mask is "
                             f"{list(attn_mask.shape)}, but should be {list(want)}.")
        if attn_mask.ndim == 2:
            attn_mask = attn_mask.unsqueeze(0)
    if bias_k is not None and bias_v is not None:
        k = cat([k, broadcast_to(bias_k, (1, N, E))])
        v = cat([v, broadcast_to(bias_v, (1, N, E))])
        attn_mask = None if attn_mask is None else _pad_last(attn_mask)
        key_padding_mask = None if key_padding_mask is None else _pad_last(key_padding_mask)
    elif bias_k is not None or bias_v is not None:
        raise ValueError("multi_head_attention: bias_k and bias_v must be given together")
    # heads: (N * H, len, head_dim), as PyTorch lays them out
    q = q.reshape(L, N * num_heads, head_dim).transpose(0, 1)
    k = static_k if static_k is not None else k.reshape(
        k.shape[0], N * num_heads, head_dim).transpose(0, 1)
    v = static_v if static_v is not None else v.reshape(
        v.shape[0], N * num_heads, head_dim).transpose(0, 1)
    for t, name in ((static_k, "static_k"), (static_v, "static_v")):
        if t is not None and (t.ndim != 3 or t.shape[0] != N * num_heads
                              or t.shape[2] != head_dim):
            raise ShapeError(f"multi_head_attention: expecting {name} of shape "
                             f"[{N * num_heads}, S, {head_dim}], got {_desc(t)}")
    if add_zero_attn:
        zeros = literal(np.zeros((N * num_heads, 1, head_dim), q._data.dtype))
        k, v = cat([k, zeros], 1), cat([v, zeros], 1)
        attn_mask = None if attn_mask is None else _pad_last(attn_mask)
        key_padding_mask = None if key_padding_mask is None else _pad_last(key_padding_mask)
    S = k.shape[1]
    if key_padding_mask is not None and key_padding_mask.shape != (N, S):
        raise ShapeError(f"multi_head_attention: expecting key_padding_mask of shape "
                         f"{[N, S]}, but got {_desc(key_padding_mask)}")
    # (N, H, L, head_dim) for the products; masks broadcast against (N, H, L, S)
    q, k, v = (t.reshape(N, num_heads, t.shape[1], head_dim) for t in (q, k, v))
    if attn_mask is not None:  # (1, L, S) or (N * H, L, S)
        heads = num_heads if attn_mask.shape[0] > 1 else 1
        attn_mask = attn_mask.reshape(-1, heads, L, S)
    if causal:
        attn_mask = literal(np.triu(np.ones((L, S), bool), 1))
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.reshape(N, 1, 1, S)
    if not training:
        dropout_p = 0.0
    scores = (q * math.sqrt(1.0 / head_dim)) @ k.transpose(-2, -1)
    scores = _apply_mask(_apply_mask(scores, attn_mask), key_padding_mask)
    weights = _f.softmax(scores, -1) if need_weights else _safe_softmax(scores)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    out = (weights @ v).permute(2, 0, 1, 3).reshape(L, N, E)
    out = F.linear(out, out_proj_weight, out_proj_bias)
    if need_weights and average_attn_weights:
        weights = _f.mean(weights, 1)
    if not batched:
        out = out.squeeze(1)
        weights = weights.squeeze(0) if need_weights else None
    return out, (weights if need_weights else None)


# ---- modules ----------------------------------------------------------------------------


class Dropout2d(Module):
    """Randomly zero whole channels (input[n, c]) with probability p while training."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return dropout2d(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


def _check_device(device):
    if device is not None and str(device) != "cpu":
        raise ValueError(f"hybridnet runs on the CPU only, got device={device!r}")


class MultiheadAttention(Module):
    """Multi-head attention (PyTorch's nn.MultiheadAttention): parameters in_proj_weight
    (or q/k/v_proj_weight when kdim or vdim differ from embed_dim), in_proj_bias,
    out_proj (a Linear), and bias_k/bias_v with add_bias_kv."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        _check_device(device)
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads, self.dropout, self.batch_first = num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise ValueError("embed_dim must be divisible by num_heads")
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(empty(3 * embed_dim, embed_dim, dtype=dtype))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter(empty(embed_dim, embed_dim, dtype=dtype))
            self.k_proj_weight = Parameter(empty(embed_dim, self.kdim, dtype=dtype))
            self.v_proj_weight = Parameter(empty(embed_dim, self.vdim, dtype=dtype))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if add_bias_kv:
            self.bias_k = Parameter(empty(1, 1, embed_dim, dtype=dtype))
            self.bias_v = Parameter(empty(1, 1, embed_dim, dtype=dtype))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        for b in (self.bias_k, self.bias_v):
            if b is not None:
                init.xavier_normal_(b)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        """Returns (output, attention weights or None); inputs (L, N, E), or (N, L, E)
        with batch_first, or unbatched (L, E)."""
        batched = query.ndim == 3
        if self.batch_first and batched:  # keep `is` between them (self-attention packs)
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (t.transpose(1, 0) for t in (query, key))
                    value = key
            else:
                query, key, value = (t.transpose(1, 0) for t in (query, key, value))
        separate = not self._qkv_same_embed_dim
        out, weights = multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=separate, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if self.batch_first and batched:
            out = out.transpose(1, 0)
        return out, weights


def _get_activation_fn(activation):
    if activation == "relu":
        return _f.relu
    if activation == "gelu":
        return _f.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {activation}")


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, each with a residual connection and a
    LayerNorm (after it, or before it with norm_first): PyTorch's layer."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=_f.relu,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        _check_device(device)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            activation = _get_activation_fn(activation)
        name = type(activation).__name__
        if activation is _f.relu or name == "ReLU":
            self.activation_relu_or_gelu = 1
        elif activation is _f.gelu or name == "GELU":
            self.activation_relu_or_gelu = 2
        else:
            self.activation_relu_or_gelu = 0
        self.activation = activation

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        """src: (S, N, E), (N, S, E) with batch_first, or unbatched (S, E)."""
        src_key_padding_mask, src_mask = _canonical_masks(
            src_key_padding_mask, "src_key_padding_mask", src_mask, "src_mask", src)
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerEncoder(Module):
    """A stack of `num_layers` deep copies of `encoder_layer`, then an optional `norm`.

    `enable_nested_tensor` and `mask_check` are accepted and ignored: hybridnet has no
    nested tensors, so padded positions are computed (not zeroed) in every mode.
    """

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.use_nested_tensor = False
        self.mask_check = mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        """src: (S, N, E), (N, S, E) with batch_first, or unbatched (S, E).

        is_causal=None is not detected from the mask's values (PyTorch's detection only
        picks an equivalent code path), so no value of the mask is read here."""
        src_key_padding_mask, mask = _canonical_masks(
            src_key_padding_mask, "src_key_padding_mask", mask, "mask", src)
        output = src
        for mod in self.layers:
            output = mod(output, src_mask=mask, is_causal=bool(is_causal),
                         src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            output = self.norm(output)
        return output
