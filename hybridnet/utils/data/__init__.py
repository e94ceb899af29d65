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

from ._collate import (
    collate,
    default_collate,
    default_collate_err_msg_format,
    default_collate_fn_map,
    default_convert,
    np_str_obj_array_pattern,
)
from .dataloader import DataLoader, get_worker_info
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    DatasetError,
    IterableDataset,
    StackDataset,
    Subset,
    T,
    T_co,
    TensorDataset,
    random_split,
)
from .sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

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
