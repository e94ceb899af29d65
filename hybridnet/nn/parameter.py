"""`nn.Parameter`: a tensor that a Module registers as a learnable parameter."""

import numpy as np

from ..tensor import Tensor, init_fields


class Parameter(Tensor):
    """A leaf tensor that requires grad by default and is registered by Modules.

    >>> w = hn.nn.Parameter(hn.zeros(3))        # doctest: +SKIP
    """

    __slots__ = ()

    def __init__(self, data=None, requires_grad: bool = True):
        arr = np.zeros((0,), np.float32) if data is None else (
            data._data if isinstance(data, Tensor) else np.asarray(data))
        init_fields(self, arr)
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
