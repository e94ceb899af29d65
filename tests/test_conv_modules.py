"""Convolution, pooling and batch-norm modules (hybridnet.nn.conv_layers) against PyTorch,
then under `hn.trace`.

Each module is built in both libraries with the same arguments (a case's `make(m)` takes
`hybridnet` or `torch`); the state dicts must have the same keys, shapes and dtypes, the
torch weights are loaded into the hybridnet module, and outputs, input gradients and
parameter gradients must agree. BatchNorm runs several training steps on different
batches (running statistics and num_batches_tracked compared after each), then eval.
Default initialisation follows PyTorch's bounds. The JIT part: a LeNet forward compiled
(numba and llvm) equals eager; a CNN training step with BatchNorm runs on the twin-state
harness (tests/twins.py) for SGD with momentum and Adam. Distinct traced graphs in this
file: 6 (LeNet x 2 backends, the training step and its eval forward x 2 optimizers).
"""

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import twins
from twins import Twin, call, run_twins

import hybridnet as hn
import hybridnet.nn.functional as F
from hybridnet import optim

RTOL32, ATOL32 = 1e-5, 1e-5  # float32 against torch's float32
GRAD_RTOL32, GRAD_ATOL32 = 1e-4, 1e-5

# torch warns that 'same' padding with an even kernel copies the input; nothing to test
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")


def _np(t):
    return t.detach().numpy().copy()


def _dtype_name(dtype) -> str:
    return str(dtype).split(".")[-1]


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


def _load_from_torch(hmod, tmod):
    """Check the two state dicts agree in keys, shapes and dtypes; copy torch's values
    into hmod and check they arrived."""
    hsd, tsd = hmod.state_dict(), tmod.state_dict()
    assert list(hsd) == list(tsd)
    for k in tsd:
        assert tuple(hsd[k].shape) == tuple(tsd[k].shape), k
        assert _dtype_name(hsd[k].dtype) == _dtype_name(tsd[k].dtype), k
    result = hmod.load_state_dict({k: v.numpy() for k, v in tsd.items()})
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    for k, v in hmod.state_dict().items():
        np.testing.assert_array_equal(_np(v), tsd[k].numpy(), err_msg=k)


def _randomize(tmod, rng):
    """Give torch's affine batch-norm parameters values other than 1 and 0."""
    with torch.no_grad():
        for name, p in tmod.named_parameters():
            if name.endswith("weight") and p.ndim == 1:
                p.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, p.shape).astype(np.float32)))
            elif p.ndim == 1:
                p.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, p.shape).astype(np.float32)))


# ---- every module: state dict, outputs, input and parameter gradients -----------------


@dataclass(frozen=True)
class M:
    name: str
    make: object  # make(m): the module, m = hybridnet or torch
    shape: tuple  # input shape


MODULES = [
    M("Conv1d", lambda m: m.nn.Conv1d(3, 4, 3), (2, 3, 9)),
    M("Conv1d-stride-pad-dilation", lambda m: m.nn.Conv1d(3, 4, 3, stride=2, padding=2,
                                                         dilation=2), (2, 3, 11)),
    M("Conv1d-same-groups-nobias", lambda m: m.nn.Conv1d(4, 6, 4, padding="same", groups=2,
                                                        bias=False), (3, 4, 7)),
    M("Conv1d-unbatched", lambda m: m.nn.Conv1d(3, 2, 2), (3, 6)),
    M("Conv2d", lambda m: m.nn.Conv2d(3, 4, 3), (2, 3, 6, 5)),
    M("Conv2d-stride2-pad1", lambda m: m.nn.Conv2d(3, 5, 3, stride=2, padding=1), (2, 3, 7, 8)),
    M("Conv2d-pairs-dilation", lambda m: m.nn.Conv2d(2, 3, (3, 2), stride=(1, 2), padding=(2, 1),
                                                    dilation=(2, 1)), (2, 2, 7, 9)),
    M("Conv2d-same", lambda m: m.nn.Conv2d(3, 4, 4, padding="same"), (2, 3, 5, 6)),
    M("Conv2d-valid-nobias", lambda m: m.nn.Conv2d(3, 4, 2, padding="valid", bias=False),
      (2, 3, 5, 6)),
    M("Conv2d-groups", lambda m: m.nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 5, 5)),
    M("Conv2d-depthwise", lambda m: m.nn.Conv2d(3, 6, 3, groups=3), (2, 3, 6, 6)),
    M("Conv2d-unbatched", lambda m: m.nn.Conv2d(3, 4, 3, padding=1), (3, 5, 4)),
    M("Conv2d-float64", lambda m: m.nn.Conv2d(3, 4, 3, dtype=m.float64), (2, 3, 6, 5)),
    M("ConvTranspose2d", lambda m: m.nn.ConvTranspose2d(3, 4, 3), (2, 3, 4, 5)),
    M("ConvTranspose2d-stride-outpad", lambda m: m.nn.ConvTranspose2d(
        3, 2, 3, stride=2, padding=1, output_padding=1), (2, 3, 4, 4)),
    M("ConvTranspose2d-groups-dilation-nobias", lambda m: m.nn.ConvTranspose2d(
        4, 6, 3, groups=2, dilation=2, bias=False), (2, 4, 3, 3)),
    M("MaxPool1d", lambda m: m.nn.MaxPool1d(3, 2, 1), (2, 3, 9)),
    M("MaxPool1d-ceil-indices", lambda m: m.nn.MaxPool1d(2, ceil_mode=True,
                                                        return_indices=True), (2, 3, 7)),
    M("MaxPool2d", lambda m: m.nn.MaxPool2d(2), (2, 3, 6, 6)),
    M("MaxPool2d-pad-dilation-ceil", lambda m: m.nn.MaxPool2d(3, 2, 1, dilation=2,
                                                             ceil_mode=True), (2, 2, 8, 9)),
    M("MaxPool2d-indices", lambda m: m.nn.MaxPool2d((2, 3), return_indices=True), (2, 2, 6, 7)),
    M("AvgPool1d", lambda m: m.nn.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 3, 9)),
    M("AvgPool1d-ceil", lambda m: m.nn.AvgPool1d(2, ceil_mode=True), (2, 3, 7)),
    M("AvgPool2d", lambda m: m.nn.AvgPool2d(2), (2, 3, 6, 6)),
    M("AvgPool2d-exclude-pad-ceil", lambda m: m.nn.AvgPool2d(3, 2, 1, ceil_mode=True,
                                                            count_include_pad=False),
      (2, 2, 6, 8)),
    M("AvgPool2d-divisor", lambda m: m.nn.AvgPool2d(2, 1, divisor_override=3), (2, 2, 4, 5)),
    M("AdaptiveAvgPool2d-1", lambda m: m.nn.AdaptiveAvgPool2d(1), (2, 3, 5, 6)),
    M("AdaptiveAvgPool2d-uneven", lambda m: m.nn.AdaptiveAvgPool2d((3, None)), (2, 3, 7, 4)),
    M("BatchNorm1d-2d", lambda m: m.nn.BatchNorm1d(4), (6, 4)),
    M("BatchNorm1d-3d", lambda m: m.nn.BatchNorm1d(3), (4, 3, 5)),
    M("BatchNorm2d", lambda m: m.nn.BatchNorm2d(3), (2, 3, 4, 5)),
    M("BatchNorm2d-no-affine", lambda m: m.nn.BatchNorm2d(3, affine=False), (2, 3, 4, 5)),
]


@pytest.mark.parametrize("case", MODULES, ids=[c.name for c in MODULES])
def test_module_matches_torch(case):
    rng = np.random.default_rng(len(case.name))
    torch.manual_seed(0)
    tmod, hmod = case.make(torch), case.make(hn)
    _randomize(tmod, rng)
    _load_from_torch(hmod, tmod)
    assert [n for n, _ in hmod.named_parameters()] == [n for n, _ in tmod.named_parameters()]
    dtype = next(iter(tmod.parameters()), torch.zeros(0)).dtype
    x = rng.standard_normal(case.shape).astype(np.float32).astype(_dtype_name(dtype))
    hx, tx = hn.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    hout, tout = _flat(hmod(hx)), _flat(tmod(tx))
    assert len(hout) == len(tout)
    for k, (h, t) in enumerate(zip(hout, tout)):
        assert h.shape == tuple(t.shape) and _dtype_name(h.dtype) == _dtype_name(t.dtype), k
        if t.dtype.is_floating_point:
            np.testing.assert_allclose(_np(h), _np(t), rtol=RTOL32, atol=ATOL32,
                                       err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(_np(h), _np(t), err_msg=f"output {k}")
    g = rng.standard_normal(tout[0].shape).astype(x.dtype)
    (hout[0] * hn.tensor(g)).sum().backward()
    (tout[0] * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(_np(hx.grad), _np(tx.grad), rtol=GRAD_RTOL32, atol=GRAD_ATOL32,
                               err_msg="input gradient")
    tparams = dict(tmod.named_parameters())
    for name, p in hmod.named_parameters():
        assert p.grad is not None, name
        np.testing.assert_allclose(_np(p.grad), _np(tparams[name].grad), rtol=GRAD_RTOL32,
                                   atol=GRAD_ATOL32, err_msg=f"gradient of {name}")
    for name, b in tmod.named_buffers():  # batch norm: the training step moved them
        np.testing.assert_allclose(_np(dict(hmod.named_buffers())[name]), _np(b), rtol=RTOL32,
                                   atol=ATOL32, err_msg=name)


@pytest.mark.parametrize("spec", [
    "Conv2d(3, 4, 3)", "Conv2d(3, 4, (3, 2), stride=2, padding=1, dilation=2, bias=False)",
    "Conv2d(4, 4, 3, padding='same', groups=2)", "Conv1d(3, 4, 3, stride=2)",
    "Conv1d(3, 6, 3, padding='valid', groups=3)",
    "ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)",
    "MaxPool2d(3, 2, 1, ceil_mode=True)", "MaxPool1d(3, 2)", "AvgPool2d(3, 2, 1)",
    "AvgPool1d(3)", "AdaptiveAvgPool2d((2, None))"])
def test_module_repr_and_attributes_match_torch(spec):
    h, t = eval("hn.nn." + spec), eval("torch.nn." + spec)  # (the fixed strings above)
    assert repr(h) == repr(t)
    for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
                 "groups", "output_padding", "ceil_mode", "count_include_pad",
                 "divisor_override", "return_indices", "output_size", "padding_mode"):
        if hasattr(t, attr):
            assert getattr(h, attr) == getattr(t, attr), attr


# ---- BatchNorm: training steps, running statistics, eval -----------------------------


BATCHNORMS = [
    ("BatchNorm1d-2d", lambda m: m.nn.BatchNorm1d(4), [(8, 4), (5, 4), (16, 4), (2, 4)]),
    ("BatchNorm1d-3d", lambda m: m.nn.BatchNorm1d(3), [(4, 3, 6), (2, 3, 5), (6, 3, 1)]),
    ("BatchNorm2d", lambda m: m.nn.BatchNorm2d(3), [(4, 3, 5, 5), (2, 3, 4, 6), (1, 3, 3, 3)]),
    ("BatchNorm2d-momentum-None", lambda m: m.nn.BatchNorm2d(3, momentum=None),
     [(4, 3, 3, 4), (2, 3, 4, 4), (3, 3, 2, 2), (5, 3, 1, 2)]),
    ("BatchNorm1d-momentum-None-3d", lambda m: m.nn.BatchNorm1d(2, momentum=None),
     [(3, 2, 4), (5, 2, 3), (2, 2, 2)]),
    ("BatchNorm1d-affine-False", lambda m: m.nn.BatchNorm1d(4, affine=False),
     [(6, 4), (3, 4), (9, 4)]),
    ("BatchNorm2d-no-running-stats", lambda m: m.nn.BatchNorm2d(3, track_running_stats=False),
     [(4, 3, 3, 3), (2, 3, 4, 2)]),
    ("BatchNorm1d-no-running-stats-no-affine",
     lambda m: m.nn.BatchNorm1d(3, affine=False, track_running_stats=False), [(5, 3), (4, 3, 2)]),
    ("BatchNorm1d-momentum-eps", lambda m: m.nn.BatchNorm1d(4, momentum=0.3, eps=1e-3),
     [(6, 4), (3, 4), (7, 4)]),
    ("BatchNorm2d-float64", lambda m: m.nn.BatchNorm2d(3, dtype=m.float64),
     [(4, 3, 3, 3), (2, 3, 5, 2)]),
]


def _compare_buffers(hmod, tmod, when):
    hb = dict(hmod.named_buffers())
    tb = dict(tmod.named_buffers())
    assert sorted(hb) == sorted(tb), when
    for name, t in tb.items():
        h = hb[name]
        assert (h is None) == (t is None), f"{when}: {name}"
        if t is None:
            continue
        assert _dtype_name(h.dtype) == _dtype_name(t.dtype), f"{when}: {name}"
        if t.dtype.is_floating_point:
            np.testing.assert_allclose(_np(h), _np(t), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{when}: {name}")
        else:
            np.testing.assert_array_equal(_np(h), _np(t), err_msg=f"{when}: {name}")


def _bn_step(hmod, tmod, x, rng, when, grad=True):
    hx, tx = hn.tensor(x, requires_grad=grad), torch.tensor(x, requires_grad=grad)
    hout, tout = hmod(hx), tmod(tx)
    np.testing.assert_allclose(_np(hout), _np(tout), rtol=1e-5, atol=1e-5,
                               err_msg=f"{when}: output")
    if grad:
        g = rng.standard_normal(x.shape).astype(x.dtype)
        (hout * hn.tensor(g)).sum().backward()
        (tout * torch.from_numpy(g)).sum().backward()
        np.testing.assert_allclose(_np(hx.grad), _np(tx.grad), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{when}: input gradient")
        tparams = dict(tmod.named_parameters())
        for name, p in hmod.named_parameters():
            np.testing.assert_allclose(_np(p.grad), _np(tparams[name].grad), rtol=1e-4,
                                       atol=1e-5, err_msg=f"{when}: {name}.grad")
    _compare_buffers(hmod, tmod, when)


@pytest.mark.parametrize("name, make, shapes", BATCHNORMS, ids=[b[0] for b in BATCHNORMS])
def test_batchnorm_training_steps_then_eval_match_torch(name, make, shapes):
    rng = np.random.default_rng(len(name))
    tmod, hmod = make(torch), make(hn)
    _randomize(tmod, rng)
    _load_from_torch(hmod, tmod)
    dtype = _dtype_name(tmod.running_mean.dtype if tmod.running_mean is not None else
                        torch.get_default_dtype())
    if tmod.track_running_stats:
        assert _dtype_name(hmod.num_batches_tracked.dtype) == "int64"
    else:
        assert hmod.running_mean is None and hmod.num_batches_tracked is None
    c = shapes[0][1]
    loc, scale = rng.uniform(-3, 3, c), rng.uniform(0.5, 3, c)  # per-channel statistics
    for i, shape in enumerate(shapes):
        expand = (1, c) + (1,) * (len(shape) - 2)
        x = (rng.standard_normal(shape) * scale.reshape(expand) + loc.reshape(expand))
        hmod.zero_grad()
        tmod.zero_grad()
        _bn_step(hmod, tmod, x.astype(dtype), rng, f"training step {i} {list(shape)}")
    if tmod.track_running_stats:
        assert int(hmod.num_batches_tracked.item()) == len(shapes)
        assert not np.allclose(_np(hmod.running_mean), 0.0)  # the statistics did move
    hmod.eval()
    tmod.eval()
    assert not hmod.training
    for i, shape in enumerate(shapes[:2]):
        x = rng.standard_normal(shape) * 2.0 + 1.0
        _bn_step(hmod, tmod, x.astype(dtype), rng, f"eval call {i}", grad=i == 0)
    if tmod.track_running_stats:  # a batch of one is fine in eval mode, with running stats
        one = rng.standard_normal((1,) + shapes[0][1:]).astype(dtype)
        with hn.no_grad(), torch.no_grad():
            _bn_step(hmod, tmod, one, rng, "eval, batch of one", grad=False)
    sd = hmod.state_dict()
    for k, v in tmod.state_dict().items():
        np.testing.assert_allclose(_np(sd[k]).astype(np.float64), v.numpy().astype(np.float64),
                                   rtol=1e-5, atol=1e-6, err_msg=f"state_dict[{k!r}]")


@pytest.mark.parametrize("make, shape, exc, words", [
    (lambda m: m.nn.BatchNorm2d(3), (2, 3, 4), ValueError, ("BatchNorm2d", "4D", "3D")),
    (lambda m: m.nn.BatchNorm1d(3), (2, 3, 4, 4), ValueError, ("BatchNorm1d", "4D")),
    (lambda m: m.nn.BatchNorm1d(3), (2, 4), ValueError, ("BatchNorm1d", "3", "[2, 4]")),
    (lambda m: m.nn.BatchNorm1d(3), (1, 3), ValueError, ("batch_norm", "[1, 3]")),
    (lambda m: m.nn.Conv2d(3, 4, 3), (2, 4, 5, 5), hn.ShapeError, ("conv2d", "[2, 4, 5, 5]")),
    (lambda m: m.nn.Conv2d(3, 4, 5), (1, 3, 4, 4), hn.ShapeError, ("conv2d", "[1, 3, 4, 4]")),
    (lambda m: m.nn.ConvTranspose2d(3, 4, 3), (1, 2, 4, 4), hn.ShapeError,
     ("conv_transpose2d", "[1, 2, 4, 4]")),
], ids=["bn2d-3d-input", "bn1d-4d-input", "bn1d-wrong-channels", "bn1d-one-value-training",
        "conv2d-wrong-channels", "conv2d-kernel-too-large", "convT-wrong-channels"])
def test_module_errors(make, shape, exc, words):
    with pytest.raises(exc) as info:
        make(hn)(hn.ones(*shape))
    missing = [w for w in words if w not in str(info.value)]
    assert not missing, f"{info.value} does not name {missing}"
    with pytest.raises((RuntimeError, ValueError)):
        make(torch)(torch.ones(*shape))


@pytest.mark.parametrize("make, error", [
    (lambda: hn.nn.Conv2d(4, 6, 3, groups=3), "in_channels (4)"),
    (lambda: hn.nn.Conv2d(4, 6, 3, groups=4), "out_channels (6)"),
    (lambda: hn.nn.Conv2d(4, 6, 3, padding_mode="reflect"), "'reflect'"),
    (lambda: hn.nn.ConvTranspose2d(4, 6, 3, padding="same"), "padding"),
], ids=["groups-in", "groups-out", "padding-mode", "convT-same"])
def test_module_constructor_errors(make, error):
    with pytest.raises((ValueError, NotImplementedError)) as info:
        make()
    assert error in str(info.value)


# ---- default initialisation ---------------------------------------------------------------


@pytest.mark.parametrize("make, fan_in", [
    (lambda m: m.nn.Conv2d(64, 128, 3), 64 * 9),
    (lambda m: m.nn.Conv2d(64, 256, 3, groups=8), 8 * 9),
    (lambda m: m.nn.Conv1d(32, 256, 5), 32 * 5),
    (lambda m: m.nn.ConvTranspose2d(16, 64, 4), 64 * 16),  # fan_in from weight dim 1
    (lambda m: m.nn.ConvTranspose2d(32, 64, 3, groups=4), 16 * 9),
], ids=["Conv2d", "Conv2d-groups", "Conv1d", "ConvTranspose2d", "ConvTranspose2d-groups"])
def test_default_init_follows_pytorch_bounds(make, fan_in):
    bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), ..)
    torch.manual_seed(0)
    tmod = make(torch)
    hn.manual_seed(0)
    hmod = make(hn)
    assert tuple(hmod.weight.shape) == tuple(tmod.weight.shape)
    assert hmod.weight.dtype == hn.float32 and hmod.bias.dtype == hn.float32
    for lib, w, b in (("hn", _np(hmod.weight), _np(hmod.bias)),
                      ("torch", _np(tmod.weight), _np(tmod.bias))):
        assert np.abs(w).max() <= bound * (1 + 1e-6), lib
        assert np.abs(w).max() > 0.995 * bound, lib  # >= 9216 draws reach the bound
        sd = bound / math.sqrt(3)  # U(-b, b); below: 4 standard errors of each estimate
        assert abs(w.mean()) < 4 * sd / math.sqrt(w.size), lib
        assert abs(w.std() - sd) < 4 * 0.45 * sd / math.sqrt(w.size), lib
        assert abs(np.mean(np.abs(w) < bound / 2) - 0.5) < 4 * 0.5 / math.sqrt(w.size), lib
        assert np.abs(b).max() <= bound * (1 + 1e-6), lib
        assert np.abs(b).max() > 0.8 * bound, lib
    hn.manual_seed(0)
    np.testing.assert_array_equal(_np(make(hn).weight), _np(hmod.weight))  # reproducible


def test_batchnorm_default_state():
    bn = hn.nn.BatchNorm2d(5)
    np.testing.assert_array_equal(_np(bn.weight), np.ones(5))
    np.testing.assert_array_equal(_np(bn.bias), np.zeros(5))
    np.testing.assert_array_equal(_np(bn.running_mean), np.zeros(5))
    np.testing.assert_array_equal(_np(bn.running_var), np.ones(5))
    assert bn.num_batches_tracked.item() == 0 and bn.num_batches_tracked.shape == ()
    assert not bn.running_mean.requires_grad and bn.weight.requires_grad
    assert [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var",
                                                  "num_batches_tracked"]


# ---- the JIT: a compiled LeNet forward ----------------------------------------------------


def lenet(m):
    nn = m.nn
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))


@pytest.mark.parametrize("backend", ["llvm", "numba"])
def test_lenet_forward_compiles_and_matches_eager_and_torch(backend):
    torch.manual_seed(1)
    tmodel, model = lenet(torch), lenet(hn)
    _load_from_torch(model, tmodel)
    traced = hn.trace(model, backend=backend)
    rng = np.random.default_rng(2)
    calls = 4
    with hn.no_grad():
        for i in range(calls):
            x = rng.standard_normal((3, 1, 28, 28)).astype(np.float32)
            got, want = traced(hn.tensor(x)), model(hn.tensor(x))
            assert got.shape == (3, 10) and got.dtype == hn.float32
            np.testing.assert_allclose(_np(got), _np(want), rtol=1e-5, atol=1e-5,
                                       err_msg=f"call {i}: compiled vs eager")
            with torch.no_grad():
                np.testing.assert_allclose(_np(got), tmodel(torch.from_numpy(x)).numpy(),
                                           rtol=1e-4, atol=1e-5, err_msg=f"call {i}: torch")
        stats = traced.stats
        assert stats.compiled_calls == calls - 1, (str(stats), stats.events)
        assert stats.compiles + stats.kernel_reuses == 1 and stats.fallbacks == 0, stats.events
        report = hn.explain(traced, hn.tensor(x))  # two more calls, both compiled
    info = report.to_dict()
    assert info["stats"]["compiled_calls"] == calls + 1
    (spec,) = info["specializations"]
    assert not spec["fallback"]
    (trace_info,) = spec["traces"]
    assert trace_info["backend"] == backend and not trace_info["backend_fallback"]
    assert "unfold" in trace_info["optimized"]  # the convolutions and pools were captured
    assert trace_info["kernels"]
    assert "runs eagerly" not in str(report)


# ---- the JIT: a CNN training step with BatchNorm on the twin-state harness ----------------


STEPS, EVAL_CALLS = 5, 3
TWIN_OPTS = {
    "sgd_momentum": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: optim.Adam(ps, lr=0.01),
}


def cnn_twin(seed, opt_name):
    # the convolutions before a BatchNorm have no bias: its exact gradient is 0, and Adam
    # would turn round-off noise in it into full-size steps, different in any two programs
    nn = hn.nn
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, bias=False), nn.BatchNorm2d(6, momentum=None), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 2 * 2, 3))
    opt = TWIN_OPTS[opt_name](list(model.parameters()))

    def fn(x, y):
        if not hn.is_grad_enabled():
            return model(x)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    def calls(f):
        for _ in range(STEPS):
            yield call(hn.randn(4, 2, 8, 8), hn.randint(0, 3, (4,)))
        model.eval()
        for _ in range(EVAL_CALLS):
            yield call(hn.randn(4, 2, 8, 8), hn.randint(0, 3, (4,)), grad=False)
        model.train()
        yield call(hn.randn(4, 2, 8, 8), hn.randint(0, 3, (4,)))
    return Twin(fn, {"model": model, "opt": opt}, calls)


@pytest.mark.parametrize("opt_name", sorted(TWIN_OPTS))
def test_cnn_training_step_with_batchnorm_on_twins(opt_name):
    name = f"conv/cnn_bn_training_{opt_name}"
    traced = run_twins(name, lambda seed: cnn_twin(seed, opt_name), seed=3)
    outcomes = next(r for r in reversed(twins.RESULTS) if r["name"] == name)["outcomes"]
    assert len(outcomes) == STEPS + EVAL_CALLS + 1
    compiled = [o == "compiled" for o in outcomes]
    # the first call records, the second creates the optimizer state (eager); the eval
    # forward is a new specialization recorded at its first call; training again hits
    assert compiled[2:STEPS] == [True] * (STEPS - 2), outcomes
    assert compiled[STEPS + 1:] == [True] * EVAL_CALLS, outcomes
    assert traced.stats.fallbacks == 0, traced.stats.events
    frac = sum(compiled) / len(compiled)
    print(f"{name}: {sum(compiled)}/{len(compiled)} calls ran compiled ({frac:.0%})")
