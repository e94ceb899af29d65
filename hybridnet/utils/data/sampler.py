"""Samplers, as torch.utils.data.sampler: Sampler, SequentialSampler, RandomSampler,
SubsetRandomSampler, WeightedRandomSampler and BatchSampler."""

import itertools
from typing import Generic, TypeVar

import numpy as np

from ...tensor import Tensor
from ._random import _check_generator, _rng

T_co = TypeVar("T_co", covariant=True)


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


def _positive_int(name, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got "
                         f"{name}={value}")


def _boolean(name, value, error=ValueError) -> None:
    if not isinstance(value, bool):
        raise error(f"{name} should be a boolean value, but got {name}={value}")


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
        _boolean("replacement", self.replacement, TypeError)
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
        _positive_int("num_samples", num_samples)
        _boolean("replacement", replacement)
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
        _positive_int("batch_size", batch_size)
        _boolean("drop_last", drop_last)
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
