"""Flatten parameters into one vector and back, as torch.nn.utils does."""

from ...shape import cat, reshape
from ...tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters):
    """One 1-d tensor holding all `parameters`, flattened and concatenated (differentiable)."""
    return cat([reshape(p, -1) for p in parameters])


def vector_to_parameters(vec, parameters) -> None:
    """Give each of `parameters` its slice of `vec`, reshaped to its shape.

    As in PyTorch this assigns `param.data`: the parameters then share `vec`'s memory.
    """
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected hybridnet.Tensor, but got: {type(vec).__name__}")
    pointer = 0
    for param in parameters:
        n = param.numel()
        if pointer + n > vec.numel():
            raise ValueError(f"vector_to_parameters: vec has {vec.numel()} elements, fewer "
                             "than the parameters need")
        param.data = reshape(vec[pointer:pointer + n], *param.shape).data
        pointer += n
