"""The PyTorch tensor surface of hybridnet.tensor_ops and hybridnet.device against
torch: values, dtypes and gradients (float64), table-driven, plus devices, dtype
conversions of tensors and modules, and the errors for what hybridnet cannot do."""

import numpy as np
import pytest
import torch

import hybridnet as hn
import hybridnet.nn as nn

RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 4))
B = RNG.standard_normal((4, 5))
C3 = RNG.standard_normal((2, 3, 4))
D3 = RNG.standard_normal((2, 4, 3))
TIES = np.array([[3.0, 1.0, 3.0, -2.0, np.nan], [0.5, 0.5, 0.5, 0.0, -0.0]])
IDX = np.array([[0, 2, 1, 0], [2, 2, 0, 1]])
MASK = A > 0.3
V3 = RNG.standard_normal(3)

# (id, fn(lib, *tensors) for lib in (hn, torch), float64 inputs, differentiable?)
CASES = [
    ("t", lambda m, a: a.t(), (A,), True),
    ("t-1d", lambda m, a: a.t(), (V3,), True),
    ("mm", lambda m, a, b: a.mm(b), (A, B), True),
    ("bmm", lambda m, a, b: m.bmm(a, b), (C3, D3), True),
    ("narrow", lambda m, a: a.narrow(1, 1, 2), (A,), True),
    ("narrow-neg", lambda m, a: m.narrow(a, 0, -2, 2), (A,), True),
    ("masked_fill", lambda m, a: a.masked_fill(a > 0.3, -1.5), (A,), True),
    ("masked_fill-bcast", lambda m, a: a.masked_fill(m.tensor([True, False, True, False]), 0.0),
     (A,), True),
    ("gather0", lambda m, a: a.gather(0, m.tensor(IDX)), (A,), True),
    ("gather1", lambda m, a: m.gather(a, 1, m.tensor(IDX[:, :3])), (A,), True),
    ("take_along_dim", lambda m, a: m.take_along_dim(a, m.tensor(IDX), 0), (A,), True),
    ("scatter_add", lambda m, a, s: a.scatter_add(0, m.tensor(IDX), s), (A, A[:2]), True),
    ("index_select", lambda m, a: a.index_select(1, m.tensor([3, 0, 3])), (A,), True),
    ("flip", lambda m, a: a.flip(0), (A,), True),
    ("flip-2", lambda m, a: m.flip(a, (0, 1)), (A,), True),
    ("roll", lambda m, a: a.roll(1, 1), (A,), True),
    ("roll-multi", lambda m, a: m.roll(a, (-1, 2), (0, 1)), (A,), True),
    ("roll-flat", lambda m, a: a.roll(5), (A,), True),
    ("repeat", lambda m, a: a.repeat(2, 1, 3), (A,), True),
    ("tile", lambda m, a: a.tile((2,)), (A,), True),
    ("tril", lambda m, a: a.tril(), (A,), True),
    ("triu-1", lambda m, a: m.triu(a, 1), (A,), True),
    ("tril-batched", lambda m, a: a.tril(-1), (C3,), True),
    ("norm", lambda m, a: a.norm(), (A,), True),
    ("norm-dim", lambda m, a: a.norm(dim=1, keepdim=True), (A,), True),
    ("norm-1", lambda m, a: a.norm(p=1, dim=0), (A,), True),
    ("norm-inf", lambda m, a: a.norm(p=float("inf"), dim=1), (A,), True),
    ("norm-3", lambda m, a: a.norm(p=3), (A,), True),
    ("norm-zero-row", lambda m, a: (a * m.tensor([[0.0], [1.0], [1.0]], dtype=a.dtype)).norm(
        dim=1), (A,), True),
    ("cumsum", lambda m, a: a.cumsum(1), (A,), True),
    ("cumsum-0", lambda m, a: m.cumsum(a, dim=0), (C3,), True),
    ("sort", lambda m, a: a.sort(1).values, (A,), True),
    ("sort-desc", lambda m, a: a.sort(0, descending=True)[0], (A,), True),
    ("sort-indices", lambda m, a: a.sort(dim=1, stable=True).indices, (TIES,), False),
    ("sort-desc-indices", lambda m, a: a.sort(dim=1, descending=True, stable=True)[1], (TIES,),
     False),
    ("argsort", lambda m, a: a.argsort(dim=1, stable=True), (TIES,), False),
    ("topk", lambda m, a: a.topk(2).values, (A,), True),
    ("topk-smallest", lambda m, a: a.topk(2, 0, largest=False)[0], (A,), True),
    ("topk-indices", lambda m, a: m.topk(a, 3, 1).indices, (A,), False),
    ("einsum-mm", lambda m, a, b: m.einsum("ij,jk->ik", a, b), (A, B), True),
    ("einsum-bmm", lambda m, a, b: m.einsum("bij,bjk->bik", a, b), (C3, D3), True),
    ("einsum-outer", lambda m, a, b: m.einsum("i,j->ij", a, b), (V3, V3), True),
    ("einsum-dot", lambda m, a, b: m.einsum("i,i->", a, b), (V3, V3), True),
    ("einsum-trans-sum", lambda m, a: m.einsum("ij->j", a), (A,), True),
    ("einsum-implicit", lambda m, a, b: m.einsum("ij,jk", a, b), (A, B), True),
    ("einsum-3", lambda m, a, b, c: m.einsum("ij,jk,kl->il", a, b, c), (A, B, B.T.copy()),
     True),
    ("einsum-attn", lambda m, q, k: m.einsum("bhd,bkd->bhk", q, k), (C3, C3), True),
    ("any", lambda m, a: (a > 1.5).any(), (A,), False),
    ("all-dim", lambda m, a: (a > -3).all(1), (A,), False),
    ("new_zeros", lambda m, a: a.new_zeros(2, 3), (A,), False),
    ("new_full", lambda m, a: a.new_full((2,), 3.5), (A,), False),
    ("new_tensor", lambda m, a: a.new_tensor([1, 2]), (A,), False),
    ("reshape_as", lambda m, a, b: a.reshape_as(b), (A, A.reshape(4, 3)), True),
]


def _run(lib, fn, arrays, grad):
    ts = [lib.tensor(a, requires_grad=grad) for a in arrays]
    return ts, fn(lib, *ts)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(case):
    _, fn, arrays, grad = case
    hts, hout = _run(hn, fn, arrays, grad)
    tts, tout = _run(torch, fn, arrays, grad)
    got, want = hout.detach().numpy(), tout.detach().numpy()
    assert got.shape == want.shape and str(got.dtype) == str(want.dtype), (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    if grad:
        g = RNG.standard_normal(want.shape)
        (hout * hn.tensor(g)).sum().backward()
        (tout * torch.tensor(g)).sum().backward()
        for h, t in zip(hts, tts):
            if t.grad is None:
                assert h.grad is None
                continue
            np.testing.assert_allclose(h.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_traced_sort_topk_cumsum_gather_equal_eager():
    def f(x):
        return x.sort(1).values.cumsum(1), x.topk(2, 0).indices, x.gather(1, x.argsort(1))
    traced = hn.trace(f)
    x = hn.tensor(A.astype(np.float32))
    with hn.no_grad():
        traced(x)
        outs = traced(x)
        want = f(x)
    assert traced.stats.compiled_calls >= 1
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-6)


def test_devices_are_the_cpu_and_other_devices_raise_clearly():
    x = hn.randn(2, 3, device="cpu")
    assert x.device == hn.device("cpu") == "cpu" and str(x.device) == "cpu"
    assert x.to("cpu") is x and x.cpu() is x and x.to(hn.device("cpu:0")) is x
    assert x.to("cpu", hn.float64).dtype == hn.float64 and x.to(x.double()).dtype == hn.float64
    assert x.to(dtype=hn.float64, copy=True).dtype == hn.float64
    assert x.to("cpu", copy=True) is not x
    assert not hn.cuda.is_available() and hn.cuda.device_count() == 0
    assert not hn.accelerator.is_available() and not hn.backends.mps.is_available()
    assert repr(hn.device("cuda", 1)) == "device(type='cuda', index=1)"
    for bad in (lambda: x.to("cuda"), lambda: x.cuda(), lambda: hn.zeros(2, device="cuda:0"),
                lambda: nn.Linear(2, 2).to("mps"), lambda: hn.randn_like(x, device="cuda")):
        with pytest.raises(RuntimeError, match="CPU only|no CUDA"):
            bad()
    with pytest.raises(RuntimeError, match="Expected one of"):
        hn.device("gpu")


def test_type_half_format_and_aliases():
    x = hn.tensor([[1.5, -2.25]])
    assert x.type() == "hybridnet.FloatTensor" and x.type("torch.DoubleTensor").dtype == hn.float64
    assert x.type(hn.int64).dtype == hn.int64
    assert f"{x[0, 0]:+.2f}" == "+1.50" and "{:.1f}".format(x.sum()) == "-0.8"
    assert x.ndimension() == 2 and x.nelement() == 2 and x.dim() == 2 and x.size(1) == 2
    assert x.is_floating_point() and not x.is_cuda
    with pytest.raises(hn.DTypeError, match="float16"):
        x.half()


def test_like_factories_follow_the_input():
    x = hn.zeros(2, 3, dtype=hn.float64)
    hn.manual_seed(3)
    a = hn.randn_like(x)
    hn.manual_seed(3)
    b = hn.randn(2, 3, dtype=hn.float64)
    assert a.dtype == hn.float64 and np.array_equal(a.numpy(), b.numpy())
    assert hn.rand_like(x).shape == (2, 3) and hn.empty_like(x).dtype == hn.float64
    r = hn.randint_like(x, 5)
    assert r.dtype == hn.float64 and r.numpy().max() < 5


def test_module_to_double_and_back_keeps_parameters_and_integer_buffers():
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    params = list(m.parameters())
    m(hn.randn(4, 3)).sum().backward()
    m.double()
    assert [p for p in m.parameters()] == params  # the same Parameter objects
    assert all(p.dtype == hn.float64 and p.grad.dtype == hn.float64 for p in params)
    assert m[1].running_mean.dtype == hn.float64
    assert m[1].num_batches_tracked.dtype == hn.int64
    assert m(hn.randn(4, 3, dtype=hn.float64)).dtype == hn.float64
    assert m.to("cpu", hn.float32) is m and m.float()[0].weight.dtype == hn.float32
    assert m.cpu() is m
    with pytest.raises(TypeError, match="floating-point"):
        m.to(hn.int64)


@pytest.mark.parametrize("bad, match", [
    (lambda: hn.randn(2, 3, 4).t(), "<= 2 dimensions"),
    (lambda: hn.randn(2, 3).mm(hn.randn(2, 3, 1)), "matrices"),
    (lambda: hn.bmm(hn.randn(2, 3, 4), hn.randn(3, 4, 2)), "batch size"),
    (lambda: hn.randn(3, 4).narrow(1, 3, 2), "out of range"),
    (lambda: hn.randn(3, 4).masked_fill(hn.ones(3, 4), 0.0), "bool"),
    (lambda: hn.randn(3, 4).gather(0, hn.tensor([[3, 0, 0, 0]])), "out of bounds"),
    (lambda: hn.randn(3, 4).gather(0, hn.tensor([0, 1])), "dims of input"),
    (lambda: hn.randn(3, 4).topk(5), "out of range"),
    (lambda: hn.einsum("ii->i", hn.randn(3, 3)), "no letter twice"),
    (lambda: hn.einsum("ij,jk->ik", hn.randn(3, 4), hn.randn(5, 2)), "sizes"),
])
def test_bad_input_raises_clearly(bad, match):
    with pytest.raises((ValueError, TypeError, IndexError, hn.ShapeError, hn.DTypeError),
                       match=match):
        bad()


def test_trace_of_a_tensor_is_the_matrix_trace_as_torch():
    a = RNG.standard_normal((3, 4))
    x, t = hn.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    got, want = hn.trace(x), torch.trace(t)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    assert x.trace().item() == pytest.approx(want.item(), rel=1e-12)
    got.backward()
    want.backward()
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())
    assert hn.trace(hn.tensor([[1, 2], [3, 4]])).dtype == hn.int64
    with pytest.raises(hn.ShapeError, match="matrix"):
        hn.trace(hn.ones(3))
    assert isinstance(hn.trace(lambda v: v * 2), hn.TracedFunction)  # functions: the JIT
