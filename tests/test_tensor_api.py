"""Tensor construction, dtypes, attributes, conversion and repr (API.md, Tensors)."""

import numpy as np
import pytest

import hybridnet as hn


@pytest.mark.parametrize("data, dtype", [
    (1.5, hn.float32), (3, hn.int64), (True, hn.bool), ([1.0, 2], hn.float32),
    ([[1, 2], [3, 4]], hn.int64), ([True, False], hn.bool),
    (np.zeros(2, np.float64), hn.float64), (np.zeros(2, np.int32), hn.int32),
])
def test_tensor_infers_dtype_like_pytorch(data, dtype):
    t = hn.tensor(data)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), np.asarray(data))


def test_tensor_copies_but_from_numpy_shares():
    a = np.arange(3.0)
    t, s = hn.tensor(a), hn.from_numpy(a)
    a[0] = 10.0
    assert t.numpy()[0] == 0.0 and s.numpy()[0] == 10.0
    assert np.shares_memory(s.numpy(), a)


def test_explicit_dtype_keeps_full_precision():
    assert hn.tensor(0.1, dtype=hn.float64).item() == 0.1
    assert hn.tensor([1, 2], dtype=hn.float32).dtype == hn.float32


@pytest.mark.parametrize("make, shape, dtype", [
    (lambda: hn.zeros(2, 3), (2, 3), hn.float32),
    (lambda: hn.ones((2, 3), dtype=hn.float64), (2, 3), hn.float64),
    (lambda: hn.full((2,), 7), (2,), hn.int64),
    (lambda: hn.full((2,), 7.0), (2,), hn.float32),
    (lambda: hn.empty(4), (4,), hn.float32),
    (lambda: hn.zeros_like(hn.ones(2, dtype=hn.int32)), (2,), hn.int32),
    (lambda: hn.ones_like(hn.zeros(3)), (3,), hn.float32),
    (lambda: hn.rand(5), (5,), hn.float32),
    (lambda: hn.randn(2, 2, dtype=hn.float64), (2, 2), hn.float64),
    (lambda: hn.randint(0, 5, (3, 2)), (3, 2), hn.int64),
    (lambda: hn.arange(5), (5,), hn.int64),
    (lambda: hn.arange(0, 1, 0.25), (4,), hn.float32),
    (lambda: hn.linspace(0, 1, 5), (5,), hn.float32),
    (lambda: hn.eye(3), (3, 3), hn.float32),
])
def test_factories(make, shape, dtype):
    t = make()
    assert t.shape == shape and t.dtype == dtype


def test_factories_take_requires_grad():
    assert hn.zeros(2, requires_grad=True).requires_grad
    assert hn.randn(2, requires_grad=True).is_leaf


def test_manual_seed_makes_draws_repeatable():
    hn.manual_seed(3)
    a = (hn.rand(4), hn.randn(4), hn.randint(0, 100, (4,)), hn.nn.Linear(3, 2).weight)
    hn.manual_seed(3)
    b = (hn.rand(4), hn.randn(4), hn.randint(0, 100, (4,)), hn.nn.Linear(3, 2).weight)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.detach().numpy(), y.detach().numpy())
    assert not np.array_equal(hn.rand(4).numpy(), a[0].numpy())


def test_value_ranges_of_random_factories():
    hn.manual_seed(0)
    u = hn.rand(10_000).numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    r = hn.randint(3, 7, (10_000,)).numpy()
    assert set(np.unique(r)) == {3, 4, 5, 6}
    n = hn.randn(10_000).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05


def test_attributes():
    t = hn.zeros(2, 3, 4)
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and len(t) == 2
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.dim() == 3
    assert hn.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert hn.tensor(2.5).item() == 2.5 and float(hn.tensor([2.5])) == 2.5
    assert int(hn.tensor(7)) == 7 and [1, 2, 3][hn.tensor(1)] == 2


def test_repr_shows_values_dtype_and_grad_fn():
    x = hn.tensor([1.0, 2.0], requires_grad=True)
    assert repr(x) == "tensor([1., 2.], dtype=hn.float32, requires_grad=True)"
    assert repr(x * 2.0) == "tensor([2., 4.], dtype=hn.float32, grad_fn=<mul>)"
    assert repr(hn.tensor([1, 2])) == "tensor([1, 2], dtype=hn.int64)"


def test_numpy_interop_and_reflected_ops():
    t = hn.tensor([1.0, 2.0])
    assert isinstance(np.asarray(t), np.ndarray)
    r = np.array([1.0, 1.0], np.float32) + t
    assert isinstance(r, hn.Tensor) and r.tolist() == [2.0, 3.0]
    assert (2 * t).tolist() == [2.0, 4.0] and (1 - t).tolist() == [0.0, -1.0]
    assert (2 ** t).tolist() == [2.0, 4.0] and (1 / t).tolist() == [1.0, 0.5]


def test_dtype_objects():
    assert hn.float32 == np.float32 and hn.float32 != hn.float64
    assert hn.float32.is_floating_point and not hn.int64.is_floating_point
    assert hn.tensor([1]).float().dtype == hn.float32
    assert hn.tensor([1.5]).long().tolist() == [1]
    assert hn.tensor([0.0, 2.0]).bool().tolist() == [False, True]
    assert hn.tensor([1]).to(hn.float64).dtype == hn.float64


def test_iteration_and_comparisons():
    t = hn.tensor([[1, 2], [3, 4]])
    rows = list(t)
    assert len(rows) == 2 and rows[1].tolist() == [3, 4]
    assert (t > 2).dtype == hn.bool and (t == 2).tolist() == [[False, True], [False, False]]
    assert ((t > 1) & (t < 4)).tolist() == [[False, True], [True, False]]
    assert ((t < 2) | (t > 3)).tolist() == [[True, False], [False, True]]
    assert (~(t > 2)).tolist() == [[True, True], [False, False]]


def test_inplace_operators():
    t = hn.tensor([1.0, 2.0])
    alias = t
    t += 1.0
    t *= 2.0
    t -= hn.tensor([1.0, 1.0])
    t /= 2.0
    assert alias is t and t.tolist() == [1.5, 2.5]
    t.zero_()
    assert t.tolist() == [0.0, 0.0]
    t.fill_(3.0).clamp_(max=2.0)
    assert t.tolist() == [2.0, 2.0]
    t.copy_(hn.tensor([5.0]))
    assert t.tolist() == [5.0, 5.0]
    t.add_(hn.tensor([1.0, 2.0]), alpha=-2.0)
    assert t.tolist() == [3.0, 1.0]


def test_in_place_ops_promote_as_out_of_place_ops_do():
    from compiler.errors import DTypeError
    t = hn.ones(3)
    t.mul_(hn.tensor(3.0, dtype=hn.float64))  # a 0-d float64 tensor does not widen float32
    assert t.dtype == hn.float32 and t.tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(DTypeError):
        hn.tensor([True, False]).add_(1)  # an int result cannot be written into bool
    i = hn.tensor([1, 2, 3])
    with pytest.raises(DTypeError):
        i.div_(2)  # true division gives float


# ---- how ops are bound: names, keywords, pickling, subclasses ----------------------------


@pytest.mark.parametrize("fn,params", [
    (hn.mul, ["input", "other"]), (hn.div, ["input", "other"]),
    (hn.maximum, ["input", "other"]), (hn.minimum, ["input", "other"]),
    (hn.pow, ["input", "exponent"]), (hn.exp, ["input"]), (hn.tanh, ["input"]),
])
def test_functional_ops_take_pytorchs_keyword_names(fn, params):
    import inspect
    assert list(inspect.signature(fn).parameters)[:len(params)] == params
    x = hn.tensor([1.0, 2.0])
    kwargs = dict(zip(params, [x, x]))
    np.testing.assert_array_equal(fn(**kwargs).numpy(), fn(*kwargs.values()).numpy())


def test_ops_and_tensor_methods_pickle_by_name():
    import pickle
    for fn in (hn.exp, hn.tanh, hn.mul, hn.nn.functional.sigmoid, hn.Tensor.__add__,
               hn.Tensor.__radd__, hn.Tensor.__rsub__, hn.Tensor.__lt__, hn.Tensor.__iadd__,
               hn.Tensor.__pos__, hn.Tensor.float, hn.Tensor.__init__):
        assert pickle.loads(pickle.dumps(fn)) is fn, fn


def test_augmented_assignment_goes_through_the_subclass_method():
    calls = []

    class Logged(hn.Tensor):
        __slots__ = ()

        def mul_(self, other):
            calls.append(other)
            return super().mul_(other)

    t = Logged([1.0, 2.0])
    t *= 3.0
    assert calls == [3.0] and t.tolist() == [3.0, 6.0]


def test_a_recorded_python_float_has_the_dtype_eager_computed_with():
    from hybridnet.dispatch import apply
    x = hn.tensor([1.0, 2.0])
    with hn.record() as rec:
        y = apply("add", (x, 2.5))
    const = next(n for n in rec.graph.nodes if n.op == "const")
    assert const.dtype == y._data.dtype == np.float32
    np.testing.assert_array_equal(rec.graph.run(x._data)[0], y._data)
