"""Datasets, as torch.utils.data.dataset: Dataset, IterableDataset, TensorDataset,
StackDataset, ConcatDataset, ChainDataset, Subset and random_split."""

import bisect
import itertools
import math
import warnings
from typing import Generic, TypeVar

import numpy as np

from ...tensor import Tensor
from ._random import _check_generator, _rng

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class DatasetError(ValueError, AssertionError):
    """A dataset was built from parts that do not fit (sizes that differ, no datasets).

    PyTorch raises AssertionError here; this subclasses both AssertionError and
    ValueError, so either style of handler works."""


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
