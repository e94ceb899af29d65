"""hybridnet.utils.data: datasets, samplers and DataLoader, as torch.utils.data.

Names, signatures, defaults and semantics follow PyTorch, so `from torch.utils.data
import DataLoader, TensorDataset` becomes `from hybridnet.utils.data import ...`:

>>> import hybridnet as hn
>>> from hybridnet.utils.data import DataLoader, TensorDataset
>>> ds = TensorDataset(hn.arange(10).reshape(5, 2), hn.arange(5))
>>> [x.shape for x, y in DataLoader(ds, batch_size=2)]
[(2, 2), (2, 2), (1, 2)]

Differences (see docs/data.md): loading always runs in the calling process
(`num_workers > 0` warns once and loads in-process); `pin_memory`, `timeout`,
`prefetch_factor`, `persistent_workers` and the other worker options are accepted
and ignored; a `generator=` is a `numpy.random.Generator`, and with none the shuffling
draws from hybridnet's global generator (seeded by `hn.manual_seed`); NumPy dtypes
hybridnet lacks are widened (uint8/int8/int16/uint16/uint32 to int64, float16 to
float32). Batches never carry autograd history.
"""

import bisect
import collections
import collections.abc
import copy
import itertools
import math
import re
import warnings
from typing import Generic, TypeVar

import numpy as np

from compiler import dtypes as cd
from compiler.errors import ShapeError

from .. import creation
from ..autograd import no_grad
from ..creation import from_numpy, tensor
from ..shape import stack
from ..tensor import Tensor

__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class DatasetError(ValueError, AssertionError):
    """A dataset was built from parts that do not fit (sizes that differ, no datasets).

    PyTorch raises AssertionError here; this subclasses both AssertionError and
    ValueError, so either style of handler works."""


# ---- random numbers -------------------------------------------------------------------


def _check_generator(generator, who: str):
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    raise TypeError(f"{who}: generator must be a numpy.random.Generator (e.g. "
                    f"np.random.default_rng(0)) or None for hybridnet's global generator "
                    f"(seeded by hn.manual_seed); got {type(generator).__name__}")


def _rng(generator) -> np.random.Generator:
    """The generator to draw from: the given one, else hybridnet's global one (looked up
    at each draw, so a later hn.manual_seed takes effect)."""
    return creation.generator() if generator is None else generator


# ---- datasets -------------------------------------------------------------------------


class Dataset(Generic[T_co]):
    """A map-style dataset: subclasses define `__getitem__(index)` and usually `__len__`.

    `a + b` is `ConcatDataset([a, b])`. A subclass may also define `__getitems__(indices)`
    returning a list of samples; DataLoader then fetches a batch with one call."""

    def __getitem__(self, index):
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: "Dataset") -> "ConcatDataset":
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co]):
    """A dataset that is a stream: subclasses define `__iter__` (and may define `__len__`).

    DataLoader batches what the iterator yields, in order; `a + b` is
    `ChainDataset([a, b])`. Loading runs in the calling process, so
    `get_worker_info()` is None inside `__iter__`."""

    def __iter__(self):
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other: Dataset) -> "ChainDataset":
        return ChainDataset([self, other])


def _first_dim(t, i: int) -> int:
    shape = getattr(t, "shape", None)
    if shape is None:
        raise TypeError(f"TensorDataset: argument {i} is a {type(t).__name__}, expected a "
                        f"tensor (or NumPy array)")
    if len(shape) == 0:
        raise DatasetError(f"TensorDataset: tensor {i} is 0-d; every tensor needs a first "
                           f"dim to index samples along")
    return shape[0]


class TensorDataset(Dataset):
    """Samples are `tuple(t[index] for t in tensors)`: tensors indexed along their first
    dim, which must have the same size for all of them."""

    def __init__(self, *tensors) -> None:
        sizes = [_first_dim(t, i) for i, t in enumerate(tensors)]
        if any(s != sizes[0] for s in sizes):
            shapes = ", ".join(str(list(t.shape)) for t in tensors)
            raise DatasetError(f"Size mismatch between tensors: TensorDataset needs the same "
                               f"first dim in every tensor, got sizes {sizes} "
                               f"(shapes {shapes})")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class StackDataset(Dataset):
    """Datasets side by side: sample i is `(d1[i], d2[i], ...)`, or with keyword
    arguments `{"name": d[i], ...}`. All must have the same length."""

    def __init__(self, *args, **kwargs) -> None:
        if args and kwargs:
            raise ValueError("Supported either ``tuple``- (via ``args``) or ``dict``- (via "
                             "``kwargs``) like input/output, but both types are given.")
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        parts = list(args) if args else list(kwargs.values())
        self._length = len(parts[0])
        if any(len(d) != self._length for d in parts):
            raise ValueError(f"Size mismatch between datasets: lengths "
                             f"{[len(d) for d in parts]}")
        self.datasets = args if args else kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset):
    """Datasets one after another; negative indices count from the end of the whole."""

    @staticmethod
    def cumsum(sequence) -> list:
        """Running totals of the lengths of `sequence`'s datasets."""
        out, total = [], 0
        for d in sequence:
            total += len(d)
            out.append(total)
        return out

    def __init__(self, datasets) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise DatasetError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise DatasetError("ConcatDataset does not support IterableDataset "
                                   "(use ChainDataset)")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        n = len(self)
        if idx < 0:
            if -idx > n:
                raise ValueError(f"absolute value of index should not exceed dataset length "
                                 f"(index {idx}, length {n})")
            idx = n + idx
        if idx >= n:
            raise IndexError(f"index {idx} is out of range for a ConcatDataset of length {n}")
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        sample = idx if d == 0 else idx - self.cumulative_sizes[d - 1]
        return self.datasets[d][sample]


class ChainDataset(IterableDataset):
    """IterableDatasets one after another, chained on the fly."""

    def __init__(self, datasets) -> None:
        self.datasets = datasets

    def __iter__(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise DatasetError("ChainDataset only supports IterableDataset")
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise DatasetError("ChainDataset only supports IterableDataset")
            total += len(d)
        return total


class Subset(Dataset):
    """The samples of `dataset` at `indices`: `Subset(ds, idx)[i]` is `ds[idx[i]]`
    (negative `i` counts from the end of the subset, as for a list)."""

    def __init__(self, dataset, indices) -> None:
        if isinstance(indices, Tensor):
            indices = indices.tolist()
        elif isinstance(indices, np.ndarray):
            indices = indices.tolist()
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list) -> list:
        """The samples at `indices` (a list), fetched as a batch."""
        if type(self).__getitem__ is not Subset.__getitem__:
            # a subclass overrode __getitem__ only: honour it (PyTorch raises instead)
            return [self[i] for i in indices]
        inner = [self.indices[i] for i in indices]
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__(inner)
        return [self.dataset[i] for i in inner]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(dataset, lengths, generator=None) -> list:
    """Split `dataset` into non-overlapping random Subsets of the given `lengths`.

    `lengths` are sizes summing to `len(dataset)`, or fractions summing to 1: each gets
    `floor(frac * len(dataset))` and the remainder is dealt out one by one from the
    first split on, as PyTorch does. The permutation comes from `generator` (a
    numpy.random.Generator) or hybridnet's global generator (`hn.manual_seed`)."""
    _check_generator(generator, "random_split")
    lengths = list(lengths)
    n = len(dataset)
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            sizes.append(math.floor(n * frac))
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, size in enumerate(sizes):
            if size == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an "
                              f"empty dataset.", stacklevel=2)
        lengths = sizes
    for i, size in enumerate(lengths):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise ValueError(f"random_split: lengths must be ints summing to the dataset's "
                             f"length or fractions summing to 1; got {lengths} "
                             f"(index {i} is {size!r})")
        if size < 0:
            raise ValueError(f"random_split: length at index {i} is negative ({size})")
    if sum(lengths) != n:
        raise ValueError(f"Sum of input lengths does not equal the length of the input "
                         f"dataset! (lengths {lengths} sum to {sum(lengths)}, the dataset "
                         f"has {n} samples)")
    indices = _rng(generator).permutation(n).tolist()
    return [Subset(dataset, indices[end - size:end])
            for end, size in zip(itertools.accumulate(lengths), lengths)]


# ---- samplers -------------------------------------------------------------------------


class Sampler(Generic[T_co]):
    """Base of samplers: `__iter__` yields indices (or lists of indices, for a batch
    sampler); `__len__` says how many, when known."""

    def __init__(self, data_source=None) -> None:
        # (old PyTorch accepted data_source here; subclasses still pass it)
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler[int]):
    """Indices 0, 1, ..., len(data_source) - 1, always in that order."""

    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """Indices in random order: a fresh permutation each pass (with `num_samples` larger
    than the data, whole permutations then part of one); with `replacement=True`,
    `num_samples` independent uniform draws. Draws come from `generator` (a
    numpy.random.Generator) or hybridnet's global generator (`hn.manual_seed`)."""

    def __init__(self, data_source, replacement: bool = False, num_samples=None,
                 generator=None) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = _check_generator(generator, "RandomSampler")
        if not isinstance(self.replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got "
                            f"replacement={self.replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got "
                             f"num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        """How many indices one pass yields (len(data_source) unless given)."""
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        rng = _rng(self.generator)
        if self.replacement:
            yield from rng.integers(0, n, size=self.num_samples, dtype=np.int64).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from rng.permutation(n).tolist()
        if self.num_samples % n:
            yield from rng.permutation(n)[:self.num_samples % n].tolist()

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler[int]):
    """The given indices, in a fresh random order each pass (no replacement)."""

    def __init__(self, indices, generator=None) -> None:
        self.indices = indices
        self.generator = _check_generator(generator, "SubsetRandomSampler")

    def __iter__(self):
        for i in _rng(self.generator).permutation(len(self.indices)).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler[int]):
    """`num_samples` indices in [0, len(weights)) drawn with probabilities proportional
    to `weights`, with replacement by default."""

    def __init__(self, weights, num_samples: int, replacement: bool = True,
                 generator=None) -> None:
        if (not isinstance(num_samples, int) or isinstance(num_samples, bool)
                or num_samples <= 0):
            raise ValueError(f"num_samples should be a positive integer value, but got "
                             f"num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got "
                             f"replacement={replacement}")
        w = np.asarray(weights.tolist() if isinstance(weights, Tensor) else weights,
                       dtype=np.float64)
        if w.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape "
                             f"{tuple(w.shape)}")
        if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
            raise RuntimeError("WeightedRandomSampler: weights must be finite, non-negative "
                               "and not all zero")
        if not replacement and num_samples > np.count_nonzero(w):
            raise RuntimeError(f"WeightedRandomSampler: cannot draw {num_samples} samples "
                               f"without replacement from {np.count_nonzero(w)} non-zero "
                               f"weights")
        self.weights = w
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = _check_generator(generator, "WeightedRandomSampler")

    def __iter__(self):
        p = self.weights / self.weights.sum()
        draw = _rng(self.generator).choice(len(p), size=self.num_samples,
                                           replace=self.replacement, p=p)
        yield from draw.tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list]):
    """Groups the indices of `sampler` into lists of `batch_size` (the last one shorter,
    or dropped with `drop_last=True`)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool) -> None:
        if (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                or batch_size <= 0):
            raise ValueError(f"batch_size should be a positive integer value, but got "
                             f"batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got "
                             f"drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        it = iter(self.sampler)
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


# ---- collation ------------------------------------------------------------------------

np_str_obj_array_pattern = re.compile(r"[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
    "found {}")


def _np_to_tensor(a) -> Tensor:
    """torch.as_tensor for NumPy data: shares memory when the dtype is one hybridnet has;
    other dtypes are widened (small ints to int64, float16 to float32)."""
    arr = np.asarray(a)
    dt = arr.dtype
    if not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
        dt = arr.dtype
    if dt in cd.SUPPORTED:
        return from_numpy(arr)
    if dt.kind in "iu":
        if dt == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise TypeError("a uint64 array holds values beyond int64, the widest integer "
                            "hybridnet has")
        return from_numpy(arr.astype(cd.int64))
    if dt.kind == "f":
        return from_numpy(arr.astype(cd.float32 if dt.itemsize < 4 else cd.float64))
    raise TypeError(f"cannot make a tensor from a NumPy array of dtype {dt}; hybridnet has "
                    f"float32, float64, int32, int64 and bool")


def _collate_tensor_fn(batch, *, collate_fn_map=None):
    elem = batch[0]
    shape = elem.shape
    for i, t in enumerate(batch):
        if not isinstance(t, Tensor):
            raise TypeError(f"default_collate: entry 0 of the batch is a Tensor but entry "
                            f"{i} is a {type(t).__name__}")
        if t.shape != shape:
            raise ShapeError(f"default_collate: stack expects each tensor to be equal size, "
                             f"but got {list(shape)} at entry 0 and {list(t.shape)} at entry "
                             f"{i} (pass a collate_fn that pads or keeps them in a list)")
    dtype = elem._data.dtype
    if all(t._data.dtype == dtype for t in batch):
        # hn.stack's result, built in one NumPy call (a fresh leaf: no history)
        return from_numpy(np.stack([t._data for t in batch]))
    with no_grad():
        return stack([t.detach() for t in batch], 0)


def _collate_numpy_array_fn(batch, *, collate_fn_map=None):
    elem = batch[0]
    if np_str_obj_array_pattern.search(elem.dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    return collate([_np_to_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def _collate_numpy_scalar_fn(batch, *, collate_fn_map=None):
    return _np_to_tensor(np.array(batch))


def _collate_float_fn(batch, *, collate_fn_map=None):
    return tensor(batch, dtype=cd.float64)


def _collate_int_fn(batch, *, collate_fn_map=None):
    return tensor(batch)


def _collate_str_fn(batch, *, collate_fn_map=None):
    return batch


default_collate_fn_map = {
    Tensor: _collate_tensor_fn,
    np.ndarray: _collate_numpy_array_fn,
    (np.bool_, np.number, np.object_): _collate_numpy_scalar_fn,
    float: _collate_float_fn,
    int: _collate_int_fn,
    str: _collate_str_fn,
    bytes: _collate_str_fn,
}


def _unknown_type_error(elem_type) -> TypeError:
    msg = default_collate_err_msg_format.format(elem_type)
    if elem_type.__module__.split(".")[0] == "torch":
        msg += (" (a torch tensor: hybridnet batches hybridnet Tensors; build the dataset "
                "with hn.tensor / hn.from_numpy, or convert with t.numpy())")
    return TypeError(msg)


def collate(batch, *, collate_fn_map=None):
    """Collate a list of samples by their structure, as torch's `collate`: each element
    type is looked up in `collate_fn_map` (exact type first, then isinstance in order);
    mappings, namedtuples and sequences are collated field by field."""
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, collate_type):
                return collate_fn_map[collate_type](batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        fields = {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map)
                  for key in elem}
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                clone = copy.copy(elem)
                clone.update(fields)
                return clone
            return elem_type(fields)
        except TypeError:
            return fields
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return elem_type(*(collate(samples, collate_fn_map=collate_fn_map)
                           for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if not all(len(e) == size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        fields = [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
        if isinstance(elem, tuple):
            return fields  # a list, as PyTorch returns
        try:
            if isinstance(elem, collections.abc.MutableSequence):
                clone = copy.copy(elem)
                for i, f in enumerate(fields):
                    clone[i] = f
                return clone
            return elem_type(fields)
        except TypeError:
            return fields
    raise _unknown_type_error(elem_type)


def default_collate(batch):
    """Merge a list of samples into a batch, as torch's default_collate.

    Tensors are stacked on a new first dim; NumPy arrays and NumPy scalars become tensors
    of their dtype; Python floats give float64, ints int64 and bools bool (as PyTorch);
    strings and bytes stay a list; dicts, namedtuples, tuples and lists are collated
    field by field (a tuple gives a list). The result has no autograd history."""
    return collate(batch, collate_fn_map=default_collate_fn_map)


def default_convert(data):
    """Turn NumPy arrays and scalars in `data` into tensors, leaving the rest (Python
    numbers, strings) as is; used instead of collation when `batch_size=None`."""
    elem_type = type(data)
    if isinstance(data, Tensor):
        return data
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "bytes_"):
        if (elem_type is np.ndarray
                and np_str_obj_array_pattern.search(data.dtype.str) is not None):
            return data
        return _np_to_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        fields = {key: default_convert(data[key]) for key in data}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(fields)
                return clone
            return elem_type(fields)
        except TypeError:
            return fields
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        fields = [default_convert(d) for d in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, f in enumerate(fields):
                    clone[i] = f
                return clone
            return elem_type(fields)
        except TypeError:
            return fields
    return data


def get_worker_info():
    """None: hybridnet loads data in the calling process (no worker processes)."""
    return None


# ---- DataLoader -----------------------------------------------------------------------

_WARNED_WORKERS = [False]


def _warn_workers_once(num_workers: int) -> None:
    if _WARNED_WORKERS[0]:
        return
    _WARNED_WORKERS[0] = True
    warnings.warn(f"DataLoader(num_workers={num_workers}): hybridnet has no worker "
                  f"processes; data is loaded in the main process (as num_workers=0), "
                  f"worker_init_fn is not called and get_worker_info() is None. "
                  f"(This warning is shown once.)", UserWarning, stacklevel=3)


class _InfiniteConstantSampler(Sampler):
    """None forever: the sampler behind an IterableDataset."""

    def __iter__(self):
        while True:
            yield None


def _index_list(indices):
    if not isinstance(indices, list) or not indices:
        return None
    for i in indices:
        if not isinstance(i, (int, np.integer)) or isinstance(i, (bool, np.bool_)):
            return None
    return indices


def _fast_batch(dataset, indices):
    """default_collate([dataset[i] for i in indices]) for a TensorDataset (or a plain
    Subset of one) in one NumPy index per tensor, or None when that does not apply."""
    while type(dataset) is Subset:
        inner = dataset.indices
        try:
            indices = [inner[i] for i in indices]
        except (TypeError, IndexError):
            return None
        dataset = dataset.dataset
    if type(dataset) is not TensorDataset or not dataset.tensors:
        return None
    if _index_list(indices) is None:
        return None
    arrays = []
    for t in dataset.tensors:
        if isinstance(t, Tensor):
            arrays.append(t._data)
        elif isinstance(t, np.ndarray) and np_str_obj_array_pattern.search(t.dtype.str) is None:
            arrays.append(t)
        else:
            return None
    idx = np.asarray(indices, dtype=np.int64)
    return [from_numpy(a[idx]) if isinstance(t, Tensor) else _np_to_tensor(a[idx])
            for a, t in zip(arrays, dataset.tensors)]


class DataLoader(Generic[T_co]):
    """Iterate over `dataset` in batches, as torch.utils.data.DataLoader.

    Map-style datasets are read in the order of `sampler` (by default SequentialSampler,
    or RandomSampler with `shuffle=True`: a new order each epoch, drawn from `generator`
    or hybridnet's global generator so `hn.manual_seed` fixes it), grouped by a
    BatchSampler of `batch_size` (`drop_last` drops a short last batch) and merged by
    `collate_fn` (default_collate). `batch_size=None` turns batching off (samples pass
    through default_convert). An IterableDataset is batched in stream order.

    Loading runs in the calling process: `num_workers > 0` warns once and loads
    in-process; `pin_memory`, `timeout`, `worker_init_fn`, `multiprocessing_context`,
    `prefetch_factor`, `persistent_workers`, `pin_memory_device` and `in_order` are
    accepted (checked as PyTorch checks them) and otherwise ignored. Batches are
    hybridnet Tensors without autograd history (samples are fetched under no_grad)."""

    _initialized = False

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None,
                 pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True) -> None:
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 "
                             "to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in "
                             "multiprocessing. let num_workers > 0 to enable "
                             "multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if multiprocessing_context is not None and num_workers == 0:
            raise ValueError(f"multiprocessing_context can only be used with multi-process "
                             f"loading (num_workers > 0), but got num_workers={num_workers}")
        generator = _check_generator(generator, "DataLoader")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order

        self._is_iterable = isinstance(dataset, IterableDataset)
        if self._is_iterable:
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"shuffle option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"sampler option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler="
                                 f"{batch_sampler}")
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with "
                                 "batch_size, shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if sampler is None:
            if self._is_iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._IterableDataset_len_called = None
        if num_workers > 0:
            _warn_workers_once(num_workers)
        self._initialized = True

    def __setattr__(self, attr, val) -> None:
        if self._initialized and attr in ("batch_size", "batch_sampler", "sampler",
                                          "drop_last", "dataset", "persistent_workers"):
            raise ValueError(f"{attr} attribute should not be set after "
                             f"{type(self).__name__} is initialized")
        super().__setattr__(attr, val)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __iter__(self) -> "_DataLoaderIter":
        return _DataLoaderIter(self)

    def __len__(self) -> int:
        if self._is_iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    return length // self.batch_size
                return math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)


class _DataLoaderIter:
    """One pass over a DataLoader (what `iter(loader)` returns)."""

    def __init__(self, loader: DataLoader) -> None:
        self._dataset = loader.dataset
        self._is_iterable = loader._is_iterable
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._collate_fn = loader.collate_fn
        self._index_sampler = loader._index_sampler
        self._len_called = loader._IterableDataset_len_called
        self._sampler_iter = iter(self._index_sampler)
        self._dataset_iter = iter(self._dataset) if self._is_iterable else None
        self._ended = False
        self._num_yielded = 0

    def __iter__(self) -> "_DataLoaderIter":
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self):
        index = next(self._sampler_iter)  # StopIteration ends the epoch
        with no_grad():
            data = self._fetch_iterable(index) if self._is_iterable else self._fetch(index)
        self._num_yielded += 1
        if (self._is_iterable and self._len_called is not None
                and self._num_yielded > self._len_called):
            warnings.warn(f"Length of IterableDataset {self._dataset} was reported to be "
                          f"{self._len_called} (when accessing len(dataloader)), but "
                          f"{self._num_yielded} samples have been fetched. ", stacklevel=2)
        return data

    def _fetch(self, index):
        if not self._auto_collation:
            return self._collate_fn(self._dataset[index])
        if self._collate_fn is default_collate:
            fast = _fast_batch(self._dataset, index)
            if fast is not None:
                return fast
        getitems = getattr(self._dataset, "__getitems__", None)
        if callable(getitems):
            data = getitems(index)
        else:
            data = [self._dataset[i] for i in index]
        return self._collate_fn(data)

    def _fetch_iterable(self, index):
        if self._ended:
            raise StopIteration
        if not self._auto_collation:
            return self._collate_fn(next(self._dataset_iter))
        data = []
        for _ in index:
            try:
                data.append(next(self._dataset_iter))
            except StopIteration:
                self._ended = True
                break
        if not data or (self._drop_last and len(data) < len(index)):
            raise StopIteration
        return self._collate_fn(data)
