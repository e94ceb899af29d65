"""Arrays inside an llvm kernel: a buffer slot (the index of its pointer among the
kernel's parameters) with a static shape, strides and offset (a view shares its base's
slot), shared by compiler.lowering.llvm_emit and llvm_nodes.
"""

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

I8P, I32, I64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)


def contiguous(shape) -> tuple:
    """C-order strides of `shape`, in elements."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


@dataclass
class Buf:
    """An array in the kernel: buffer slot, dtype, padded shape, strides and offset in
    elements (a view shares its base's slot)."""

    slot: int
    dtype: np.dtype
    shape: tuple
    strides: tuple
    offset: int = 0

    @property
    def is_contiguous(self) -> bool:
        return all(st == c for st, c, n in zip(self.strides, contiguous(self.shape), self.shape)
                   if n != 1)
