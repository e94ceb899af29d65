"""Collation, as torch.utils.data._utils.collate: default_collate, default_convert,
collate and default_collate_fn_map (and the NumPy-to-tensor conversion they share)."""

import collections.abc
import copy
import re

import numpy as np

from compiler import dtypes as cd
from compiler.errors import ShapeError

from ...autograd import no_grad
from ...creation import from_numpy, tensor
from ...shape import stack
from ...tensor import Tensor

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
        return _rebuild(elem, fields)
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
        return _rebuild(elem, fields)
    raise _unknown_type_error(elem_type)


def _rebuild(like, fields):
    """`fields` in a container of `like`'s type: a copy of a mutable mapping or sequence
    with its items replaced, else the type built from them, else the plain dict or list
    (as torch's collate does)."""
    try:
        if isinstance(like, collections.abc.MutableMapping):
            clone = copy.copy(like)
            clone.update(fields)
            return clone
        if isinstance(like, collections.abc.MutableSequence):
            clone = copy.copy(like)
            for i, f in enumerate(fields):
                clone[i] = f
            return clone
        return type(like)(fields)
    except TypeError:
        return fields


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
        return _rebuild(data, fields)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        fields = [default_convert(d) for d in data]
        return _rebuild(data, fields)
    return data
