"""Regression tests from an adversarial review of the PyTorch-surface work (tensor ops,
the JIT's global keys, `.data` updates while recording, the .pt reader). Each asserts
what PyTorch or the eager run does; each failed when it was written."""

import functools
import io
import pickle
import struct
import sys
import tracemalloc
import types
import zipfile

import numpy as np
import pytest
import torch  # noqa: E402  (the oracle: a test extra)

import hybridnet as hn


def _compiled_then(traced, *args, calls=3):
    for _ in range(calls):
        traced(*args)
    assert traced.stats.compiled_calls >= 1, traced.stats.events


# ---- what a traced function reaches by name ---------------------------------------------

_CFG = types.ModuleType("hn_adversarial_cfg")  # a user config module
_CFG.scale = 2.0
sys.modules[_CFG.__name__] = _CFG
hn_adversarial_cfg = _CFG  # (also a global of this module, as `import cfg` at the top)


def _import_inside(x):
    import hn_adversarial_cfg
    return x * hn_adversarial_cfg.scale


def _from_import_inside(x):
    from hn_adversarial_cfg import scale
    return x * scale


@pytest.mark.parametrize("fn", [_import_inside, _from_import_inside])
def test_config_module_imported_inside_the_function_is_keyed(fn):
    """IMPORT_NAME is not LOAD_GLOBAL: since keys hold only loaded globals, a config
    module imported inside the function is no longer keyed and its settings go stale."""
    _CFG.scale = 2.0
    traced, x = hn.trace(fn), hn.ones(2)
    _compiled_then(traced, x)
    _CFG.scale = 7.0
    try:
        np.testing.assert_array_equal(traced(x).numpy(), fn(x).numpy())  # [7, 7]
    finally:
        _CFG.scale = 2.0


def test_builtin_shadowed_by_a_global_after_compiling_is_seen():
    ns = {"__name__": "hn_adversarial_ns"}
    exec("def f(x):\n    return x * float(len([1, 2]))\n", ns)  # noqa: S102
    traced, x = hn.trace(ns["f"]), hn.ones(3)
    _compiled_then(traced, x)
    ns["len"] = lambda seq: 5  # a global `len` now shadows the builtin
    np.testing.assert_array_equal(traced(x).numpy(), ns["f"](x).numpy())  # [5, 5, 5]


class _Scaler:
    def __init__(self):
        self.k = 2.0

    def __call__(self, x):
        return x * self.k


def test_traced_callable_object_keys_its_attributes():
    scaler = _Scaler()
    traced, x = hn.trace(scaler), hn.ones(2)
    _compiled_then(traced, x)
    scaler.k = 7.0
    np.testing.assert_array_equal(traced(x).numpy(), scaler(x).numpy())  # [7, 7]


_FACTOR = [2.0]


def _times_factor(x, k):
    return x * k * _FACTOR[0]


def test_traced_partial_keys_what_its_function_reads():
    traced, x = hn.trace(functools.partial(_times_factor, k=1.0)), hn.ones(2)
    _compiled_then(traced, x)
    _FACTOR[0] = 7.0
    try:
        np.testing.assert_array_equal(traced(x).numpy(), _times_factor(x, 1.0).numpy())
    finally:
        _FACTOR[0] = 2.0


_OBJ = _Scaler()
_BOUND = _OBJ.__call__  # a bound method of a user object, reached by name
_PARTIAL = functools.partial(_times_factor, k=1.0)


def _calls_bound(x):
    return _BOUND(x)


def _calls_partial(x):
    return _PARTIAL(x)


@pytest.mark.parametrize("fn", [_calls_bound, _calls_partial])
def test_bound_methods_and_partials_reached_by_name_are_keyed_by_content(fn):
    """Keyed by identity only (types.MethodType, functools.partial are opaque): a changed
    attribute of the bound object, or a global the partial's function reads, goes stale."""
    traced, x = hn.trace(fn), hn.ones(2)
    _compiled_then(traced, x)
    _OBJ.k, _FACTOR[0] = 7.0, 7.0
    try:
        np.testing.assert_array_equal(traced(x).numpy(), fn(x).numpy())  # [7, 7]
    finally:
        _OBJ.k, _FACTOR[0] = 2.0, 2.0


# ---- .data of a tensor that is not a leaf, while a call is recorded ---------------------


def _nonleaf_data_step(w, x):
    y = w * 2
    y.data.add_(1.0)  # changes y's values, not its history (PyTorch)
    (y * x).sum().backward()
    return y


@pytest.mark.parametrize("how", ["trace", "record"])
def test_data_update_of_a_non_leaf_keeps_its_history(how):
    wt = torch.ones(3, requires_grad=True)
    yt = _nonleaf_data_step(wt, torch.ones(3))
    w = hn.ones(3, requires_grad=True)
    if how == "trace":
        y = hn.trace(_nonleaf_data_step)(w, hn.ones(3))
    else:
        with hn.record():
            y = _nonleaf_data_step(w, hn.ones(3))
    np.testing.assert_array_equal(y.detach().numpy(), yt.detach().numpy())
    assert y.is_leaf == yt.is_leaf and y.grad_fn is not None  # (False: y = w * 2)
    assert w.grad is not None, "the backward through y lost its path to w"
    np.testing.assert_array_equal(w.grad.numpy(), wt.grad.numpy())  # [2, 2, 2]


# ---- tensor ops against PyTorch ---------------------------------------------------------


def test_take_along_dim_broadcasts_the_index():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 2]])
    want = torch.take_along_dim(torch.tensor(a), torch.tensor(idx), dim=1).numpy()
    got = hn.take_along_dim(hn.tensor(a), hn.tensor(idx), dim=1)
    assert got.shape == want.shape  # (3, 2)
    np.testing.assert_array_equal(got.numpy(), want)


def test_index_select_refuses_a_negative_index():
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pytest.raises(IndexError):
        torch.tensor(a).index_select(0, torch.tensor([-1]))
    with pytest.raises(IndexError):
        hn.tensor(a).index_select(0, hn.tensor([-1]))


def test_clamp__takes_tensor_bounds_eagerly():
    want = torch.ones(3).clamp_(max=torch.tensor(0.5)).numpy()
    np.testing.assert_array_equal(hn.ones(3).clamp_(max=hn.tensor(0.5)).numpy(), want)


# ---- crafted .pt files ------------------------------------------------------------------


def _g(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _u(text):
    return b"X" + struct.pack("<I", len(text.encode())) + text.encode()


def _i(n):
    return pickle.dumps(n, protocol=2)[2:-1]


def _t(*parts):
    return b"(" + b"".join(parts) + b"t"


def _pt(pkl, records=()):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + pkl + b".")
        for name, data in records:
            z.writestr(f"archive/{name}", data)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")
    return buf.getvalue()


def _peak_of_load(data):
    tracemalloc.start()
    try:
        try:
            hn.load(io.BytesIO(data))
        except hn.SerializationError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_error_messages_do_not_repr_a_shared_structure_in_full():
    """A 500-byte data.pkl whose nested list shares its halves (pickle memo): each level
    doubles the repr the error message builds (depth 30: gigabytes, minutes; torch.load
    refuses it at once)."""
    nested = "a"
    for _ in range(19):
        nested = [nested, nested]
    data = _pt(_g("torch", "Size") + b"(" + pickle.dumps(nested, protocol=2)[2:-1] + b"tR")
    assert len(data) < 1000
    assert _peak_of_load(data) < 2 << 20


def test_repeated_expanded_tensors_do_not_multiply_memory():
    """EXPAND_LIMIT bounds one expanded view (2^24 elements), but a file can hold the same
    view many times: 8 of a 1-byte bool storage are 128 MiB from a 1.5 KB file (torch.load:
    views of the one byte). Refused or bounded, never N times the limit."""
    ordict = _g("collections", "OrderedDict") + b")R"
    pid = _t(_u("storage"), _g("torch", "BoolStorage"), _u("0"), _u("cpu"), _i(1)) + b"Q"
    one = _g("torch._utils", "_rebuild_tensor_v2") + _t(
        pid, _i(0), _t(_i(1 << 24)), _t(_i(0)), b"\x89", ordict) + b"R"
    data = _pt(b"(" + one * 8 + b"t", records=[("data/0", b"\x01")])
    assert len(torch.load(io.BytesIO(data), weights_only=True)) == 8
    assert _peak_of_load(data) < 48 << 20
