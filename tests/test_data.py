"""hn.utils.data against torch.utils.data: collation, batching, samplers, splits, errors."""

import collections
import types
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import hybridnet as hn
import hybridnet.utils.data as hud
from compiler.errors import ShapeError

Point = collections.namedtuple("Point", ["x", "y"])

HN = types.SimpleNamespace(tensor=hn.tensor, data=hud)
TORCH = types.SimpleNamespace(tensor=torch.tensor, data=tud)


def assert_same(h, t, where="batch"):
    """A hybridnet batch equals a torch batch: same structure, shapes, dtypes, values."""
    if isinstance(t, torch.Tensor):
        assert isinstance(h, hn.Tensor), f"{where}: {type(h).__name__}, expected a Tensor"
        assert h.shape == tuple(t.shape), f"{where}: shape {h.shape} vs {tuple(t.shape)}"
        assert str(h.dtype)[3:] == str(t.dtype)[6:], f"{where}: dtype {h.dtype} vs {t.dtype}"
        assert h.grad_fn is None and not h.requires_grad
        np.testing.assert_array_equal(h.numpy(), t.numpy(), err_msg=where)
    elif isinstance(t, dict):
        assert type(h) is type(t) and list(h) == list(t), where
        for k in t:
            assert_same(h[k], t[k], f"{where}[{k!r}]")
    elif isinstance(t, (list, tuple)):
        assert type(h) is type(t), f"{where}: {type(h).__name__} vs {type(t).__name__}"
        assert len(h) == len(t), where
        for i, (a, b) in enumerate(zip(h, t)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert type(h) is type(t) and h == t, f"{where}: {h!r} vs {t!r}"


class ListDataset:
    """A map-style dataset over a list (the same class serves both libraries)."""

    def __init__(self, items):
        self.items = items

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)


def _arr(i, dtype):
    return (np.arange(6).reshape(2, 3) * (i + 1) % 5).astype(dtype)


SAMPLES = {
    "float tensor": lambda lib, i: lib.tensor([i * 0.5, -i, 1.0 / (i + 1)]),
    "int tensor 2d": lambda lib, i: lib.tensor([[i, i + 1], [2 * i, -i]]),
    "bool tensor": lambda lib, i: lib.tensor([i % 2 == 0, i % 3 == 0]),
    "0-d tensor": lambda lib, i: lib.tensor(float(i) / 7),
    "tuple": lambda lib, i: (lib.tensor([float(i), 2.0]), i),
    "dict": lambda lib, i: {"x": lib.tensor([i, i]), "y": i / 3, "name": f"s{i}"},
    "python float": lambda lib, i: i * 0.1,
    "python int": lambda lib, i: i * 3 - 7,
    "python bool": lambda lib, i: i % 2 == 1,
    "str": lambda lib, i: f"item{i}",
    "bytes": lambda lib, i: b"b%d" % i,
    "namedtuple": lambda lib, i: Point(lib.tensor([i, -i]), float(i)),
    "list (transposed)": lambda lib, i: [i, float(i), f"t{i}"],
    "nested": lambda lib, i: {"a": (_arr(i, np.float32), [i, i + 1]), "b": [{"c": i}]},
    "np float32": lambda lib, i: _arr(i, np.float32),
    "np float64": lambda lib, i: _arr(i, np.float64),
    "np int32": lambda lib, i: _arr(i, np.int32),
    "np int64": lambda lib, i: _arr(i, np.int64),
    "np bool": lambda lib, i: _arr(i, np.bool_),
    "np 0-d": lambda lib, i: np.array(i * 1.5),
    "np scalar float64": lambda lib, i: np.float64(i) / 4,
    "np scalar float32": lambda lib, i: np.float32(i) / 4,
    "np scalar int32": lambda lib, i: np.int32(i),
    "np scalar bool": lambda lib, i: np.bool_(i % 2),
}


def _loaders(kind, n, **kw):
    h = hud.DataLoader(ListDataset([SAMPLES[kind](HN, i) for i in range(n)]), **kw)
    t = tud.DataLoader(ListDataset([SAMPLES[kind](TORCH, i) for i in range(n)]), **kw)
    return h, t


@pytest.mark.parametrize("kind", list(SAMPLES))
@pytest.mark.parametrize("kw", [dict(batch_size=3), dict(batch_size=4, drop_last=True),
                                dict(), dict(batch_size=None)],
                         ids=["bs3", "bs4-drop_last", "default", "bs-None"])
def test_collation_matches_torch(kind, kw):
    h, t = _loaders(kind, 10, **kw)
    hb, tb = list(h), list(t)
    assert len(h) == len(t) == len(hb) == len(tb)
    for i, (a, b) in enumerate(zip(hb, tb)):
        assert_same(a, b, f"{kind} batch {i}")


def test_default_collate_and_convert_directly():
    for kind in SAMPLES:
        hs = [SAMPLES[kind](HN, i) for i in range(3)]
        ts = [SAMPLES[kind](TORCH, i) for i in range(3)]
        assert_same(hud.default_collate(hs), tud.default_collate(ts), kind)
        assert_same(hud.default_convert(hs), tud.default_convert(ts), kind)


def test_python_number_dtypes_follow_torch():
    assert hud.default_collate([1.5, 2.0]).dtype == hn.float64
    assert hud.default_collate([1, 2]).dtype == hn.int64
    assert hud.default_collate([True, False]).dtype == hn.bool
    assert_same(hud.default_collate([1, 2.5]), tud.default_collate([1, 2.5]))  # float32
    assert_same(hud.default_collate([2.5, 1]), tud.default_collate([2.5, 1]))  # float64


@pytest.mark.parametrize("n, bs", [(10, 3), (12, 4), (7, 7), (5, 8), (1, 1), (0, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_tensor_dataset_batches_and_len_match_torch(n, bs, drop_last):
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    y = (np.arange(n) % 3).astype(np.int64)
    h = hud.DataLoader(hud.TensorDataset(hn.tensor(x), hn.tensor(y)), batch_size=bs,
                       drop_last=drop_last)
    t = tud.DataLoader(tud.TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=bs,
                       drop_last=drop_last)
    assert len(h) == len(t)
    assert len(iter(h)) == len(t)
    hb, tb = list(h), list(t)
    assert len(hb) == len(tb) == len(h)
    for a, b in zip(hb, tb):
        assert_same(a, b)


def test_tensor_dataset_fast_path_equals_per_sample_collation():
    class Plain(hud.TensorDataset):  # a subclass: fetched sample by sample
        pass

    x = hn.randn(23, 4)
    y = hn.randint(0, 5, size=(23,))
    m = hn.tensor(np.arange(23) % 2 == 0)
    for cls in (hud.TensorDataset, Plain):
        ds = cls(x, y, m)
        sub = hud.Subset(ds, list(range(22, -1, -2)))
        for d in (ds, sub):
            fast = list(hud.DataLoader(d, batch_size=5))
            slow = list(hud.DataLoader(d, batch_size=5,
                                       collate_fn=lambda b: hud.default_collate(b)))
            assert len(fast) == len(slow)
            for a, b in zip(fast, slow):
                assert type(a) is list and type(b) is list
                for u, v in zip(a, b):
                    assert u.dtype == v.dtype and u.shape == v.shape
                    np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_tensor_dataset_indexing_and_len():
    x, y = hn.arange(12).reshape(6, 2), hn.arange(6) * 10
    ds = hud.TensorDataset(x, y)
    assert len(ds) == 6
    a, b = ds[-1]
    assert a.tolist() == [10, 11] and b.item() == 50
    a, b = ds[1:3]
    assert a.shape == (2, 2) and b.tolist() == [10, 20]


def test_batches_have_no_autograd_history():
    w = hn.randn(8, 3, requires_grad=True)

    class Computed(hud.Dataset):
        def __getitem__(self, i):
            return w[i] * 2.0

        def __len__(self):
            return 8

    for ds in (hud.TensorDataset(w), Computed(), hud.Subset(hud.TensorDataset(w), [0, 1])):
        for batch in hud.DataLoader(ds, batch_size=3):
            b = batch[0] if isinstance(batch, list) else batch
            assert b.grad_fn is None and not b.requires_grad
    assert hn.is_grad_enabled()
    b = next(iter(hud.DataLoader(hud.TensorDataset(w), batch_size=4)))[0]
    np.testing.assert_array_equal(b.numpy(), w.detach().numpy()[:4])


def test_each_epoch_restarts():
    ds = hud.TensorDataset(hn.arange(7))
    loader = hud.DataLoader(ds, batch_size=3)
    first = [b[0].tolist() for b in loader]
    second = [b[0].tolist() for b in loader]
    assert first == second == [[0, 1, 2], [3, 4, 5], [6]]
    it = iter(loader)
    next(it)
    assert [b[0].tolist() for b in loader] == first  # a new iterator starts over
    assert [b[0].tolist() for b in it] == first[1:]


def _epoch(loader):
    return [i for batch in loader for i in batch[0].tolist()]


def test_shuffle_is_reproducible_with_manual_seed_and_a_permutation():
    ds = hud.TensorDataset(hn.arange(50))
    loader = hud.DataLoader(ds, batch_size=8, shuffle=True)
    hn.manual_seed(123)
    a1, a2 = _epoch(loader), _epoch(loader)
    hn.manual_seed(123)
    b1, b2 = _epoch(loader), _epoch(loader)
    assert (a1, a2) == (b1, b2)
    assert a1 != a2  # reshuffled each epoch
    assert sorted(a1) == sorted(a2) == list(range(50))  # every index once per epoch
    hn.manual_seed(124)
    assert _epoch(loader) != a1
    # the global generator is looked up at each epoch, so a later seed takes effect
    hn.manual_seed(123)
    assert _epoch(hud.DataLoader(ds, batch_size=8, shuffle=True)) == a1


def test_shuffle_with_numpy_generator_and_drop_last():
    ds = hud.TensorDataset(hn.arange(20))
    runs = []
    for _ in range(2):
        g = np.random.default_rng(5)
        loader = hud.DataLoader(ds, batch_size=6, shuffle=True, drop_last=True, generator=g)
        assert len(loader) == 3
        runs.append([_epoch(loader) for _ in range(3)])
    assert runs[0] == runs[1]
    for epoch in runs[0]:
        assert len(epoch) == 18 and len(set(epoch)) == 18
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        hud.DataLoader(ds, shuffle=True, generator=torch.Generator())


def test_random_sampler_options():
    hn.manual_seed(0)
    s = hud.RandomSampler(range(5), num_samples=12)
    out = list(s)
    assert len(s) == 12 and len(out) == 12
    assert sorted(out[:5]) == sorted(out[5:10]) == list(range(5))
    r = list(hud.RandomSampler(range(5), replacement=True, num_samples=40))
    assert len(r) == 40 and set(r) <= set(range(5))
    with pytest.raises(ValueError, match="num_samples should be a positive integer"):
        hud.RandomSampler(range(5), num_samples=0)
    with pytest.raises(TypeError, match="replacement should be a boolean"):
        hud.RandomSampler(range(5), replacement=1)
    sub = list(hud.SubsetRandomSampler([10, 20, 30]))
    assert sorted(sub) == [10, 20, 30]
    w = list(hud.WeightedRandomSampler([0.0, 1.0, 0.0, 2.0], 30))
    assert set(w) <= {1, 3}
    w = list(hud.WeightedRandomSampler([0.0, 1.0, 0.0, 2.0], 2, replacement=False))
    assert sorted(w) == [1, 3]


@pytest.mark.parametrize("n, bs, drop_last", [(10, 3, False), (10, 3, True), (9, 3, True),
                                              (2, 5, False), (2, 5, True)])
def test_batch_sampler_matches_torch(n, bs, drop_last):
    h = hud.BatchSampler(hud.SequentialSampler(range(n)), bs, drop_last)
    t = tud.BatchSampler(tud.SequentialSampler(range(n)), bs, drop_last)
    assert list(h) == list(t) and len(h) == len(t)


def test_sampler_and_batch_sampler_arguments():
    ds = hud.TensorDataset(hn.arange(10))
    loader = hud.DataLoader(ds, batch_size=2, sampler=[9, 8, 7, 0, 1])
    assert [b[0].tolist() for b in loader] == [[9, 8], [7, 0], [1]]
    loader = hud.DataLoader(ds, batch_sampler=[[3, 1], [0], [9, 9, 9]])
    assert [b[0].tolist() for b in loader] == [[3, 1], [0], [9, 9, 9]]
    assert loader.batch_size is None
    loader = hud.DataLoader(ds, batch_size=4, collate_fn=lambda b: len(b))
    assert list(loader) == [4, 4, 2]


@pytest.mark.parametrize("kw", [
    dict(shuffle=True, sampler=[0, 1]),
    dict(batch_sampler=[[0]], batch_size=2),
    dict(batch_sampler=[[0]], shuffle=True),
    dict(batch_sampler=[[0]], drop_last=True),
    dict(batch_size=None, drop_last=True),
    dict(num_workers=-1),
    dict(timeout=-1),
    dict(prefetch_factor=2),
    dict(persistent_workers=True),
    dict(batch_size=0),
    dict(batch_size=2, drop_last=1),
])
def test_loader_argument_errors_match_torch(kw):
    with pytest.raises(ValueError) as t_err:
        tud.DataLoader(tud.TensorDataset(torch.arange(4)), **kw)
    with pytest.raises(ValueError) as h_err:
        hud.DataLoader(hud.TensorDataset(hn.arange(4)), **kw)
    assert str(h_err.value)[:30] == str(t_err.value)[:30]


def test_attributes_are_frozen_after_init():
    loader = hud.DataLoader(hud.TensorDataset(hn.arange(4)))
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):
        loader.batch_size = 3
    loader.num_workers = 0  # other attributes may change, as in PyTorch


def test_num_workers_warns_once_and_loads_in_process(monkeypatch):
    monkeypatch.setattr(hud.dataloader, "_WARNED_WORKERS", [False])
    ds = hud.TensorDataset(hn.arange(6))
    with pytest.warns(UserWarning, match="loaded in the main process"):
        loader = hud.DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True,
                                persistent_workers=True, prefetch_factor=4, timeout=5,
                                worker_init_fn=lambda i: 1 / 0,
                                multiprocessing_context="spawn")
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hud.DataLoader(ds, num_workers=4)
        hud.DataLoader(ds, pin_memory=True, pin_memory_device="", in_order=False)
    assert hud.get_worker_info() is None


def test_random_split_sizes_disjoint_and_reproducible():
    ds = hud.TensorDataset(hn.arange(10))
    for lengths in ([3, 7], [0.33, 0.33, 0.34], [0.5, 0.5], [0.1, 0.2, 0.3, 0.4], [10, 0]):
        expected = [len(s) for s in tud.random_split(range(10), lengths)]
        hn.manual_seed(3)
        parts = hud.random_split(ds, lengths)
        assert [len(p) for p in parts] == expected
        seen = [ds[p.indices[i]][0].item() for p in parts for i in range(len(p))]
        assert sorted(seen) == list(range(10))
        hn.manual_seed(3)
        assert [p.indices for p in hud.random_split(ds, lengths)] == [p.indices for p in parts]
    a = hud.random_split(range(7), [0.5, 0.5], generator=np.random.default_rng(1))
    b = hud.random_split(range(7), [0.5, 0.5], generator=np.random.default_rng(1))
    assert [p.indices for p in a] == [p.indices for p in b]
    assert [len(p) for p in a] == [4, 3]
    assert all(isinstance(p, hud.Subset) for p in a)


def test_random_split_warns_on_an_empty_fraction():
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        parts = hud.random_split(range(3), [1.0, 0.0])
    assert [len(p) for p in parts] == [3, 0]


@pytest.mark.parametrize("lengths, pattern", [
    ([3, 3], r"Sum of input lengths does not equal the length of the input dataset! "
             r"\(lengths \[3, 3\] sum to 6, the dataset has 10 samples\)"),
    ([1.5, -0.5], r"Fraction at index 0 is not between 0 and 1"),
    ([12, -2], r"length at index 1 is negative \(-2\)"),
    ([2.5, 7.5], r"lengths must be ints .*\(index 0 is 2.5\)"),
])
def test_random_split_bad_lengths(lengths, pattern):
    with pytest.raises(ValueError, match=pattern):
        hud.random_split(range(10), lengths)
    if min(lengths) >= 0:  # (torch accepts [12, -2] and returns overlapping subsets)
        with pytest.raises((ValueError, TypeError, RuntimeError)):
            tud.random_split(range(10), lengths)


def test_subset_and_concat_indexing_match_torch():
    base = list(range(100, 110))
    for idx in ([3, 1, 4, 1, 5], range(2, 9, 2), np.array([9, 0, 8]), hn.tensor([7, 6])):
        h = hud.Subset(base, idx)
        t = tud.Subset(base, idx.tolist() if hasattr(idx, "tolist") else idx)
        assert len(h) == len(t)
        assert [h[i] for i in range(-len(h), len(h))] == [t[i] for i in range(-len(t),
                                                                              len(t))]
    parts = [ListDataset([1, 2, 3]), ListDataset([]), ListDataset([4, 5]), ListDataset([6])]
    h, t = hud.ConcatDataset(parts), tud.ConcatDataset(parts)
    assert len(h) == len(t) == 6 and h.cumulative_sizes == t.cumulative_sizes
    assert [h[i] for i in range(-6, 6)] == [t[i] for i in range(-6, 6)]
    with pytest.raises(ValueError, match="absolute value of index should not exceed"):
        h[-7]
    with pytest.raises(IndexError, match="index 6 is out of range .* length 6"):
        h[6]


def test_dataset_add_and_subclassing():
    a = hud.TensorDataset(hn.arange(3))
    b = hud.TensorDataset(hn.arange(10, 12))
    c = a + b
    assert isinstance(c, hud.ConcatDataset) and len(c) == 5
    assert [c[i][0].item() for i in range(-5, 5)] == [0, 1, 2, 10, 11] * 2
    assert [x[0].tolist() for x in hud.DataLoader(c, batch_size=2)] == [[0, 1], [2, 10], [11]]

    class Squares(hud.Dataset[int]):  # generic subscript, as torch's Dataset[T]
        def __getitem__(self, i):
            return i * i

        def __len__(self):
            return 4

    assert next(iter(hud.DataLoader(Squares(), batch_size=4))).tolist() == [0, 1, 4, 9]
    with pytest.raises(NotImplementedError):
        hud.Dataset()[0]

    class Picky(hud.Subset):  # overrides __getitem__ only: DataLoader must use it
        def __getitem__(self, i):
            return -super().__getitem__(i)

    assert next(iter(hud.DataLoader(Picky(list(range(5)), [4, 2]), batch_size=2))).tolist() \
        == [-4, -2]

    class WithGetitems(hud.Dataset):
        def __getitems__(self, indices):
            return [float(i) for i in indices]

        def __len__(self):
            return 3

    assert next(iter(hud.DataLoader(WithGetitems(), batch_size=3))).tolist() == [0, 1, 2]


def test_stack_dataset():
    x, y = hud.TensorDataset(hn.arange(4)), ListDataset(["a", "b", "c", "d"])
    s = hud.StackDataset(x, y)
    assert len(s) == 4 and s[1][1] == "b"
    d = hud.StackDataset(num=x, name=y)
    batch = next(iter(hud.DataLoader(d, batch_size=3)))
    assert batch["name"] == ["a", "b", "c"] and batch["num"][0].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="Size mismatch between datasets"):
        hud.StackDataset(x, ListDataset([1]))


class Stream(hud.IterableDataset):
    def __init__(self, n, with_len=True):
        self.n = n
        self.with_len = with_len

    def __iter__(self):
        return iter(float(i) for i in range(self.n))

    def __len__(self):
        if not self.with_len:
            raise TypeError("no len")
        return self.n


class TorchStream(tud.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(float(i) for i in range(self.n))

    def __len__(self):
        return self.n


@pytest.mark.parametrize("kw", [dict(batch_size=3), dict(batch_size=3, drop_last=True),
                                dict(batch_size=None), dict()])
def test_iterable_dataset_matches_torch(kw):
    h, t = hud.DataLoader(Stream(10), **kw), tud.DataLoader(TorchStream(10), **kw)
    assert len(h) == len(t)
    hb, tb = list(h), list(t)
    assert len(hb) == len(tb)
    for a, b in zip(hb, tb):
        assert_same(a, b)
    assert len(list(h)) == len(hb)  # restarts


def test_iterable_dataset_rules():
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        hud.DataLoader(Stream(3), shuffle=True)
    with pytest.raises(ValueError, match="expected unspecified sampler option"):
        hud.DataLoader(Stream(3), sampler=[0])
    chain = Stream(2) + Stream(3)
    assert isinstance(chain, hud.ChainDataset) and len(chain) == 5
    assert [b.tolist() for b in hud.DataLoader(chain, batch_size=2)] == \
        [[0.0, 1.0], [0.0, 1.0], [2.0]]
    with pytest.raises(hud.DatasetError, match="does not support IterableDataset"):
        hud.ConcatDataset([Stream(2)])
    assert len(list(hud.DataLoader(Stream(5, with_len=False), batch_size=2))) == 3


def test_tensor_dataset_size_mismatch_is_clear():
    with pytest.raises(AssertionError, match=r"Size mismatch between tensors: .* sizes "
                                             r"\[3, 4\] \(shapes \[3, 2\], \[4\]\)"):
        hud.TensorDataset(hn.zeros(3, 2), hn.zeros(4))
    with pytest.raises(ValueError, match="Size mismatch"):
        hud.TensorDataset(hn.zeros(3), hn.zeros(3), hn.zeros(2))
    with pytest.raises(ValueError, match="tensor 1 is 0-d"):
        hud.TensorDataset(hn.zeros(3), hn.tensor(1.0))
    with pytest.raises(TypeError, match="argument 0 is a list"):
        hud.TensorDataset([1, 2, 3])
    with pytest.raises(AssertionError, match="should not be an empty iterable"):
        hud.ConcatDataset([])


def test_collate_errors():
    with pytest.raises(RuntimeError, match="each element in list of batch should be of "
                                           "equal size"):
        hud.default_collate([[1, 2], [3]])
    with pytest.raises(ShapeError, match=r"stack expects each tensor to be equal size, but "
                                         r"got \[2\] at entry 0 and \[3\] at entry 1"):
        hud.default_collate([hn.zeros(2), hn.zeros(3)])
    with pytest.raises(RuntimeError):  # ShapeError is a RuntimeError, as torch's
        list(hud.DataLoader(ListDataset([hn.zeros(2), hn.zeros(3)]), batch_size=2))
    with pytest.raises(TypeError, match="batch must contain tensors, numpy arrays"):
        hud.default_collate([object(), object()])
    with pytest.raises(TypeError, match="a torch tensor"):
        hud.default_collate([torch.zeros(2), torch.zeros(2)])
    with pytest.raises(TypeError, match="batch must contain"):
        hud.default_collate([np.array(["a"]), np.array(["b"])])


def test_mixed_dtype_tensors_promote_as_torch_stack():
    h = hud.default_collate([hn.tensor([1, 2]), hn.tensor([1.5, 2.0])])
    t = tud.default_collate([torch.tensor([1, 2]), torch.tensor([1.5, 2.0])])
    assert_same(h, t)


def test_numpy_dtypes_hybridnet_lacks_are_widened():
    b = hud.default_collate([np.array([1, 255], dtype=np.uint8)] * 2)
    assert b.dtype == hn.int64 and b.tolist() == [[1, 255], [1, 255]]
    b = hud.default_collate([np.array([0.5], dtype=np.float16)] * 3)
    assert b.dtype == hn.float32 and b.shape == (3, 1)
    assert hud.default_collate([np.int16(3), np.int16(-4)]).dtype == hn.int64
    b = hud.default_convert(np.array([1.0, 2.0], dtype=">f8"))
    assert b.dtype == hn.float64 and b.tolist() == [1.0, 2.0]
    with pytest.raises(TypeError, match="dtype complex128"):
        hud.default_collate([np.zeros(2, dtype=complex)] * 2)


def test_training_loop_with_a_loader():
    hn.manual_seed(0)
    x = hn.randn(64, 3)
    y = x @ hn.tensor([[1.0], [-2.0], [0.5]]) + 0.25
    train, val = hud.random_split(hud.TensorDataset(x, y), [0.75, 0.25])
    model = hn.nn.Linear(3, 1)
    opt = hn.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(30):
        for xb, yb in hud.DataLoader(train, batch_size=16, shuffle=True):
            opt.zero_grad()
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()
            opt.step()
    with hn.no_grad():
        errs = [((model(xb) - yb) ** 2).mean().item() for xb, yb in hud.DataLoader(val,
                                                                                    batch_size=8)]
    assert max(errs) < 1e-3


def test_public_names_have_docstrings():
    for name in hud.__all__:
        obj = getattr(hud, name)
        assert obj.__doc__ and obj.__doc__.strip(), name
    assert hn.utils.data is hud
