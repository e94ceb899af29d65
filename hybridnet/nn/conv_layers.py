"""Convolution, pooling and batch-norm modules (PyTorch's names, arguments, defaults,
parameter and buffer names, and initialisation)."""

import math

from ..creation import empty, ones, tensor, zeros
from . import init
from .conv import conv1d, conv2d, conv_fan_in, conv_transpose2d, ntuple
from .module import Module
from .parameter import Parameter
from .pooling import (
    adaptive_avg_pool2d,
    avg_pool1d,
    avg_pool2d,
    batch_norm,
    max_pool1d,
    max_pool2d,
)


class _ConvNd(Module):
    """Shared by the convolutions: arguments, parameters and PyTorch's default init
    (kaiming_uniform_(a=sqrt(5)) for the weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
    the bias)."""

    _dims = 2
    transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", dtype=None,
                 output_padding=0):
        super().__init__()
        name, n = type(self).__name__, self._dims
        if groups < 1 or in_channels % groups:
            raise ValueError(f"{name}: in_channels ({in_channels}) must be divisible by "
                             f"groups ({groups})")
        if out_channels % groups:
            raise ValueError(f"{name}: out_channels ({out_channels}) must be divisible by "
                             f"groups ({groups})")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{name}: padding_mode {padding_mode!r} is not supported "
                                      "yet; only 'zeros' (pad the input with F.pad first)")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = ntuple(name, "kernel_size", kernel_size, n)
        self.stride = ntuple(name, "stride", stride, n)
        self.padding = padding if isinstance(padding, str) else ntuple(name, "padding",
                                                                          padding, n)
        self.dilation = ntuple(name, "dilation", dilation, n)
        self.output_padding = ntuple(name, "output_padding", output_padding, n)
        self.padding_mode = padding_mode
        if self.transposed:
            shape = (in_channels, out_channels // groups) + self.kernel_size
        else:
            shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(empty(*shape, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Re-draw the weights as PyTorch does."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = conv_fan_in(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * self._dims:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._dims:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * self._dims:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class Conv2d(_ConvNd):
    """2-D convolution over (N, C, H, W) or (C, H, W) inputs."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, dtype)

    def forward(self, input):
        return conv2d(input, self.weight, self.bias, self.stride, self.padding,
                      self.dilation, self.groups)


class Conv1d(_ConvNd):
    """1-D convolution over (N, C, L) or (C, L) inputs."""

    _dims = 1

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, dtype)

    def forward(self, input):
        padding = self.padding if isinstance(self.padding, str) else self.padding[0]
        return conv1d(input, self.weight, self.bias, self.stride[0], padding,
                      self.dilation[0], self.groups)


class ConvTranspose2d(_ConvNd):
    """Transposed 2-D convolution (the adjoint of Conv2d), as GAN generators use."""

    transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 dtype=None):
        if isinstance(padding, str):
            raise ValueError("ConvTranspose2d: padding must be an int or a pair")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, dtype, output_padding)

    def forward(self, input, output_size=None):
        if output_size is not None:
            raise NotImplementedError("ConvTranspose2d: output_size is not supported; set "
                                      "output_padding instead")
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                self.output_padding, self.groups, self.dilation)


class MaxPool2d(Module):
    """Max over (kernel_size) windows; stride defaults to kernel_size."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input):
        return max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(MaxPool2d):
    """Max over windows of the last dim of (N, C, L) inputs."""

    def forward(self, input):
        return max_pool1d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)


class AvgPool2d(Module):
    """Mean over (kernel_size) windows; stride defaults to kernel_size."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, input):
        return avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(AvgPool2d):
    """Mean over windows of the last dim of (N, C, L) inputs."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True):
        one = (lambda v, name: ntuple("AvgPool1d", name, v, 1))  # noqa: E731
        super().__init__(one(kernel_size, "kernel_size"),
                         None if stride is None else one(stride, "stride"),
                         one(padding, "padding"), ceil_mode, count_include_pad)

    def forward(self, input):
        return avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad)


class AdaptiveAvgPool2d(Module):
    """Mean pooling to a fixed output size (1 gives global average pooling)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _BatchNorm(Module):
    """Batch norm over dim 1, with PyTorch's buffers: running_mean, running_var and
    num_batches_tracked (momentum=None: a cumulative average over the batches seen)."""

    _ndims = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, dtype=None, *, bias=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_features, dtype=dtype)) if affine and bias else None
        for name in ("weight", "bias"):
            if getattr(self, name) is None:
                self.register_parameter(name, None)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", tensor(0))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self):
        """Running statistics back to mean 0, variance 1, no batches seen."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1.0)
            self.num_batches_tracked.zero_()

    def forward(self, input):
        if input.ndim not in self._ndims:
            want = " or ".join(f"{d}D" for d in self._ndims)
            raise ValueError(f"{type(self).__name__}: expected {want} input (got "
                             f"{input.ndim}D input)")
        if input.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}: expected {self.num_features} channels in "
                             f"dim 1, got input of shape {list(input.shape)}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a tensor: no value guard per step when traced
                factor = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        use_batch = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats
        return batch_norm(input, self.running_mean if keep else None,
                          self.running_var if keep else None, self.weight, self.bias,
                          use_batch, factor, self.eps)

    def extra_repr(self) -> str:
        bias = "" if self.bias is not None or not self.affine else ", bias=False"
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}{bias}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm of (N, C) or (N, C, L) inputs."""

    _ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm of (N, C, H, W) inputs."""

    _ndims = (4,)
