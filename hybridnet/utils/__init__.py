"""hybridnet.utils: helpers named as PyTorch's `torch.utils` (data loading for now)."""

from . import data

__all__ = ["data"]
