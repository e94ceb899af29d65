"""DataLoader, as torch.utils.data.dataloader: the loader, its per-epoch iterator, the
fast path that batches a TensorDataset with one NumPy index per tensor, and
get_worker_info."""

import math
import warnings
from typing import Generic, TypeVar

import numpy as np

from ...autograd import no_grad
from ...creation import from_numpy
from ...tensor import Tensor
from ._collate import _np_to_tensor, default_collate, default_convert, np_str_obj_array_pattern
from ._random import _check_generator
from .dataset import IterableDataset, Subset, TensorDataset
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

T_co = TypeVar("T_co", covariant=True)


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
