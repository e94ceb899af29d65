"""Convolution, pooling, pad and batch norm (hybridnet.nn.conv, hybridnet.nn.pooling)
against PyTorch, table-driven.

A case's `fn(nnf, *tensors)` is written once for both libraries: `nnf` is
`hybridnet.nn.functional` or `torch.nn.functional`. Every case is checked for its
forward result in float64 (to 1e-10) and float32, and for the gradients of a random
weighted sum of its float outputs with respect to its inputs (float64, to 1e-10); cases
marked `fd` are also checked against central finite differences (tests/oracles.py).
Batch norm cases return the running statistics they update in place, so those are
compared too. Bad inputs must raise the documented exception, naming the op and the
shapes, where PyTorch raises as well.
"""

import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from oracles import R, V, check_grad, flat, make_inputs, seed_of

import hybridnet as hn
import hybridnet.nn.functional as F
from compiler.errors import DTypeError, ShapeError
from hybridnet.dispatch import apply

TOL64 = 1e-10
TOL32 = 2e-5

# torch warns that 'same' padding with an even kernel copies the input; nothing to test
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")


# ---- input specs (beside tests/oracles.py's R) -------------------------------------------


@dataclass(frozen=True)
class Ties:
    """Values on a coarse grid (multiples of 0.5 in [0, levels/2)): exact ties in almost
    every pooling window."""

    shape: tuple
    levels: int = 3

    def make(self, rng, dtype):
        return (rng.integers(0, self.levels, self.shape) * 0.5).astype(dtype)


@dataclass(frozen=True)
class WithNaN:
    """Random floats with a NaN at each of the flat positions `at`."""

    shape: tuple
    at: tuple

    def make(self, rng, dtype):
        x = rng.uniform(-2.0, 2.0, self.shape).astype(np.float32).astype(dtype)
        x.reshape(-1)[list(self.at)] = np.nan
        return x


POS = 0.5, 2.0  # (lo, hi) of a running variance


@dataclass(frozen=True)
class Case:
    name: str
    fn: object  # fn(nnf, *tensors), nnf = hybridnet.nn.functional or torch.nn.functional
    inputs: tuple  # input specs
    wrt: tuple = None  # inputs whose gradients are compared (None: every float input)
    fd: bool = False  # also against central finite differences (float64)
    grad: bool = True  # False: no output depends differentiably on an input


def cv(op, **kw):
    """fn(nnf, x, w[, b]) calling nnf.<op>(x, w, b, **kw)."""
    return lambda nnf, x, w, b=None: getattr(nnf, op)(x, w, b, **kw)


def fn_of(op, *args, **kw):
    """fn(nnf, x) calling nnf.<op>(x, *args, **kw)."""
    return lambda nnf, x: getattr(nnf, op)(x, *args, **kw)


def bn(training, momentum=0.1, eps=1e-5, has=("rm", "rv", "w", "b")):
    """fn(nnf, x, *present) calling nnf.batch_norm and returning the output and the running
    statistics (updated in place when training); `has` names the arguments given."""
    names = ("rm", "rv", "w", "b")

    def fn(nnf, x, *given):
        args = dict(zip([n for n in names if n in has], given))
        out = nnf.batch_norm(x, args.get("rm"), args.get("rv"), args.get("w"), args.get("b"),
                           training=training, momentum=momentum, eps=eps)
        return (out,) + tuple(args[n] for n in ("rm", "rv") if n in args)
    return fn


def bn_inputs(shape, has=("rm", "rv", "w", "b")):
    c = shape[1]
    spec = {"rm": R((c,)), "rv": R((c,), *POS), "w": R((c,)), "b": R((c,))}
    return (R(shape),) + tuple(spec[n] for n in ("rm", "rv", "w", "b") if n in has)


def bn_wrt(has=("rm", "rv", "w", "b")):
    """The input and the affine parameters (PyTorch does not differentiate running stats)."""
    return (0,) + tuple(1 + i for i, n in enumerate(n for n in ("rm", "rv", "w", "b")
                                                     if n in has) if n in ("w", "b"))


def x_w_b(x, w, bias=True):
    return (R(x), R(w)) + ((R((w[0],)),) if bias else ())


def x_wt_b(x, w, groups=1, bias=True):
    """Inputs of conv_transpose2d: the bias has out_channels = w[1] * groups entries."""
    return (R(x), R(w)) + ((R((w[1] * groups,)),) if bias else ())


CASES = [
    # ---- conv1d: (N, C, L) or (C, L) input, (O, C/groups, k) weight
    Case("conv1d-basic", cv("conv1d"), x_w_b((2, 3, 9), (4, 3, 3)), fd=True),
    Case("conv1d-stride2-pad1", cv("conv1d", stride=2, padding=1), x_w_b((2, 3, 10), (4, 3, 3))),
    Case("conv1d-pad-tuple", cv("conv1d", padding=(2,)), x_w_b((1, 2, 5), (3, 2, 4))),
    Case("conv1d-dilation2-same", cv("conv1d", padding="same", dilation=2),
         x_w_b((2, 3, 8), (2, 3, 3))),
    Case("conv1d-same-even-kernel", cv("conv1d", padding="same"), x_w_b((2, 3, 7), (4, 3, 4)),
         fd=True),
    Case("conv1d-valid", cv("conv1d", padding="valid"), x_w_b((2, 3, 7), (4, 3, 5))),
    Case("conv1d-groups3-nobias", cv("conv1d", groups=3), x_w_b((2, 6, 8), (6, 2, 3), False)),
    Case("conv1d-depthwise", cv("conv1d", groups=4, padding=1), x_w_b((1, 4, 7), (8, 1, 3)),
         fd=True),
    Case("conv1d-unbatched", cv("conv1d", stride=2), x_w_b((3, 9), (4, 3, 2))),
    Case("conv1d-batch1-k1", cv("conv1d"), x_w_b((1, 3, 5), (2, 3, 1))),
    # ---- conv2d: (N, C, H, W) or (C, H, W) input, (O, C/groups, kh, kw) weight
    Case("conv2d-basic", cv("conv2d"), x_w_b((2, 3, 6, 5), (4, 3, 3, 3)), fd=True),
    Case("conv2d-stride2-odd", cv("conv2d", stride=2), x_w_b((2, 3, 7, 9), (4, 3, 3, 3))),
    Case("conv2d-stride-pad-pairs", cv("conv2d", stride=(2, 1), padding=(1, 2)),
         x_w_b((2, 2, 7, 6), (3, 2, 3, 2)), fd=True),
    Case("conv2d-pad1-nobias", cv("conv2d", padding=1), x_w_b((2, 3, 5, 5), (4, 3, 3, 3), False)),
    Case("conv2d-same-odd-kernel", cv("conv2d", padding="same"), x_w_b((2, 3, 6, 7), (4, 3, 3, 5))),
    Case("conv2d-same-even-kernel", cv("conv2d", padding="same"), x_w_b((1, 2, 5, 6), (3, 2, 4, 2)),
         fd=True),
    Case("conv2d-same-dilation", cv("conv2d", padding="same", dilation=(2, 1)),
         x_w_b((2, 2, 7, 6), (3, 2, 3, 3))),
    Case("conv2d-valid", cv("conv2d", padding="valid"), x_w_b((2, 3, 6, 5), (4, 3, 2, 3))),
    Case("conv2d-dilation2-pad2", cv("conv2d", dilation=2, padding=2),
         x_w_b((2, 3, 7, 8), (4, 3, 3, 3)), fd=True),
    Case("conv2d-dilation-stride-mixed",
         cv("conv2d", dilation=(1, 3), stride=(3, 2), padding=(0, 1)),
         x_w_b((2, 2, 9, 11), (3, 2, 2, 3))),
    Case("conv2d-groups2", cv("conv2d", groups=2, padding=1), x_w_b((2, 4, 5, 6), (6, 2, 3, 3)),
         fd=True),
    Case("conv2d-depthwise", cv("conv2d", groups=3, padding=1), x_w_b((2, 3, 6, 6), (6, 1, 3, 3)),
         fd=True),
    Case("conv2d-depthwise-nobias-stride2", cv("conv2d", groups=4, stride=2),
         x_w_b((1, 4, 7, 7), (4, 1, 3, 3), False)),
    Case("conv2d-batch1-1x1", cv("conv2d"), x_w_b((1, 5, 3, 4), (2, 5, 1, 1))),
    Case("conv2d-unbatched", cv("conv2d", padding=1), x_w_b((3, 6, 5), (4, 3, 3, 3)), fd=True),
    Case("conv2d-kernel-is-input", cv("conv2d"), x_w_b((3, 2, 4, 3), (5, 2, 4, 3))),
    Case("conv2d-nonsquare-kernel", cv("conv2d", stride=(1, 2)), x_w_b((2, 3, 7, 9), (2, 3, 2, 4))),
    Case("conv2d-transposed-layout", cv("conv2d", padding=1, stride=(2, 1)),
         (R((2, 3, 5, 6), layout="T"), R((4, 3, 3, 3), layout="T"), R((4,)))),
    # an empty batch: PyTorch gives an empty result (and empty gradients)
    Case("conv2d-empty-batch", cv("conv2d", padding=1), x_w_b((0, 2, 5, 5), (3, 2, 3, 3))),
    Case("conv1d-empty-batch", cv("conv1d"), x_w_b((0, 2, 6), (3, 2, 3))),
    Case("conv2d-wide-float32", cv("conv2d", padding=1), x_w_b((4, 8, 12, 12), (16, 8, 3, 3))),
    # ---- conv_transpose2d: (N, C, H, W) input, (C, O/groups, kh, kw) weight
    Case("convT-basic", cv("conv_transpose2d"), x_wt_b((2, 3, 4, 5), (3, 2, 3, 3)), fd=True),
    Case("convT-stride2", cv("conv_transpose2d", stride=2), x_wt_b((2, 3, 3, 4), (3, 2, 3, 3))),
    Case("convT-stride2-pad1-outpad1",
         cv("conv_transpose2d", stride=2, padding=1, output_padding=1),
         x_wt_b((2, 3, 4, 4), (3, 2, 3, 3)), fd=True),
    Case("convT-pairs", cv("conv_transpose2d", stride=(2, 3), padding=(1, 0),
                           output_padding=(1, 2)),
         x_wt_b((1, 2, 3, 4), (2, 3, 3, 2))),
    Case("convT-groups2", cv("conv_transpose2d", groups=2, stride=2),
         x_wt_b((2, 4, 3, 3), (4, 3, 3, 3), groups=2), fd=True),
    Case("convT-dilation2-pad1", cv("conv_transpose2d", dilation=2, padding=1),
         x_wt_b((2, 2, 4, 3), (2, 3, 3, 3))),
    Case("convT-dilation2-outpad1", cv("conv_transpose2d", dilation=2, output_padding=1),
         x_wt_b((1, 2, 3, 3), (2, 2, 2, 3))),
    Case("convT-big-padding", cv("conv_transpose2d", stride=2, padding=2),
         x_wt_b((1, 2, 4, 4), (2, 3, 5, 5))),
    Case("convT-empty-batch", cv("conv_transpose2d", stride=2), x_wt_b((0, 2, 3, 3), (2, 3, 3, 3))),
    Case("convT-unbatched-nobias", cv("conv_transpose2d", stride=2, padding=1),
         x_wt_b((3, 3, 4), (3, 2, 4, 4), bias=False)),
    # ---- max_pool2d
    Case("maxpool2d-k2", fn_of("max_pool2d", 2), (R((2, 3, 6, 6)),), fd=True),
    Case("maxpool2d-k3-s2-p1-odd", fn_of("max_pool2d", 3, 2, 1), (R((2, 2, 7, 5)),), fd=True),
    Case("maxpool2d-pairs", fn_of("max_pool2d", (2, 3), (1, 2)), (R((2, 2, 5, 8)),)),
    Case("maxpool2d-dilation2", fn_of("max_pool2d", 3, 1, 1, 2), (R((1, 2, 7, 6)),), fd=True),
    Case("maxpool2d-ceil", fn_of("max_pool2d", 3, 2, ceil_mode=True), (R((2, 2, 6, 8)),),
         fd=True),
    Case("maxpool2d-ceil-pad-start-rule", fn_of("max_pool2d", 2, 2, 1, ceil_mode=True),
         (R((1, 2, 5, 6)),)),
    Case("maxpool2d-ceil-dilation-pad", fn_of("max_pool2d", (3, 2), (2, 3), (1, 1), (1, 2),
                                              ceil_mode=True),
         (R((2, 2, 8, 9)),)),
    Case("maxpool2d-indices", fn_of("max_pool2d", 2, return_indices=True), (R((2, 3, 4, 6)),)),
    Case("maxpool2d-indices-pad-ceil-dilation",
         fn_of("max_pool2d", 3, 2, 1, 2, ceil_mode=True, return_indices=True),
         (R((2, 2, 8, 7)),), fd=True),
    Case("maxpool2d-ties-overlapping", fn_of("max_pool2d", 3, 1, 1), (Ties((2, 2, 6, 5)),)),
    Case("maxpool2d-ties-k2", fn_of("max_pool2d", 2), (Ties((2, 3, 6, 6), 2),)),
    Case("maxpool2d-ties-indices", fn_of("max_pool2d", (3, 2), (2, 1), (1, 1),
                                         return_indices=True), (Ties((1, 3, 7, 6)),)),
    Case("maxpool2d-ties-negative-pad", fn_of("max_pool2d", 3, 2, 1),
         (Ties((1, 2, 5, 5), 1),)),  # all zeros: the max is the first real element
    Case("maxpool2d-transposed-layout", fn_of("max_pool2d", 3, 2, 1, return_indices=True),
         (R((2, 3, 7, 6), layout="T"),)),
    Case("maxpool2d-empty-batch", fn_of("max_pool2d", 2), (R((0, 2, 4, 4)),)),
    # a window holding only -inf (and padding): PyTorch picks its first element of the
    # input (never a padding position) and sends the gradient there
    Case("maxpool2d-neginf-window-pad", fn_of("max_pool2d", 2, 2, 1, return_indices=True),
         (V([[[[-np.inf, -np.inf, 1.0], [-np.inf, -np.inf, 2.0], [0.0, 0.5, 0.0]]]]),)),
    Case("maxpool2d-nan", fn_of("max_pool2d", 2, return_indices=True),
         (WithNaN((1, 2, 4, 4), (5, 18)),), grad=False),
    Case("maxpool2d-unbatched", fn_of("max_pool2d", 2, 1), (R((3, 5, 4)),)),
    Case("maxpool2d-unbatched-indices", fn_of("max_pool2d", 2, return_indices=True),
         (R((2, 4, 5)),)),
    # ---- avg_pool2d
    Case("avgpool2d-k2", fn_of("avg_pool2d", 2), (R((2, 3, 6, 6)),), fd=True),
    Case("avgpool2d-k3-s2-p1", fn_of("avg_pool2d", 3, 2, 1), (R((2, 2, 7, 6)),), fd=True),
    Case("avgpool2d-k3-s2-p1-exclude-pad", fn_of("avg_pool2d", 3, 2, 1, count_include_pad=False),
         (R((2, 2, 7, 6)),), fd=True),
    Case("avgpool2d-ceil", fn_of("avg_pool2d", 3, 2, ceil_mode=True), (R((2, 2, 6, 8)),)),
    Case("avgpool2d-ceil-pad", fn_of("avg_pool2d", 2, 2, 1, ceil_mode=True), (R((1, 2, 5, 6)),)),
    Case("avgpool2d-ceil-pad-exclude", fn_of("avg_pool2d", 3, 2, 1, ceil_mode=True,
                                             count_include_pad=False), (R((1, 2, 6, 8)),),
         fd=True),
    Case("avgpool2d-divisor-override", fn_of("avg_pool2d", 3, 2, 1, divisor_override=3),
         (R((2, 2, 7, 6)),)),
    Case("avgpool2d-pairs", fn_of("avg_pool2d", (2, 3), (1, 2), (1, 1)), (R((2, 2, 5, 8)),)),
    Case("avgpool2d-strided-layout", fn_of("avg_pool2d", 3, 2, 1, count_include_pad=False),
         (R((4, 2, 5, 7), layout="step"),)),
    Case("avgpool2d-empty-batch", fn_of("avg_pool2d", 2), (R((0, 2, 4, 4)),)),
    Case("avgpool2d-unbatched", fn_of("avg_pool2d", 2, 1), (R((3, 5, 4)),)),
    # ---- adaptive_avg_pool2d
    Case("adaptive-1", fn_of("adaptive_avg_pool2d", 1), (R((2, 3, 5, 7)),), fd=True),
    Case("adaptive-divisible", fn_of("adaptive_avg_pool2d", (2, 3)), (R((2, 3, 4, 6)),)),
    Case("adaptive-non-divisible", fn_of("adaptive_avg_pool2d", (3, 2)), (R((2, 2, 7, 5)),),
         fd=True),
    Case("adaptive-int-non-divisible", fn_of("adaptive_avg_pool2d", 3), (R((1, 2, 5, 5)),)),
    Case("adaptive-none-h", fn_of("adaptive_avg_pool2d", (None, 3)), (R((2, 2, 4, 7)),)),
    Case("adaptive-none-w", fn_of("adaptive_avg_pool2d", (3, None)), (R((2, 2, 7, 4)),)),
    Case("adaptive-larger-than-input", fn_of("adaptive_avg_pool2d", (5, 4)), (R((1, 2, 3, 3)),),
         fd=True),
    Case("adaptive-unbatched", fn_of("adaptive_avg_pool2d", (2, 2)), (R((3, 5, 6)),)),
    # ---- max_pool1d / avg_pool1d
    Case("maxpool1d-k2", fn_of("max_pool1d", 2), (R((2, 3, 8)),), fd=True),
    Case("maxpool1d-k3-s2-p1-ceil", fn_of("max_pool1d", 3, 2, 1, ceil_mode=True),
         (R((2, 3, 8)),), fd=True),
    Case("maxpool1d-dilation-indices", fn_of("max_pool1d", 3, 1, 1, 2, return_indices=True),
         (R((2, 2, 9)),)),
    Case("maxpool1d-ties", fn_of("max_pool1d", 3, 1, 1), (Ties((2, 3, 10)),)),
    Case("maxpool1d-unbatched", fn_of("max_pool1d", 2), (R((3, 7)),)),
    Case("avgpool1d-k3-s2-p1", fn_of("avg_pool1d", 3, 2, 1), (R((2, 3, 9)),), fd=True),
    Case("avgpool1d-exclude-pad-ceil", fn_of("avg_pool1d", 3, 2, 1, ceil_mode=True,
                                             count_include_pad=False), (R((2, 3, 8)),)),
    Case("avgpool1d-unbatched", fn_of("avg_pool1d", 2), (R((3, 7)),)),
    # ---- pad (constant)
    Case("pad-last-dim", fn_of("pad", (1, 2)), (R((2, 3)),), fd=True),
    Case("pad-two-dims", fn_of("pad", (1, 0, 2, 1)), (R((2, 3, 4)),)),
    Case("pad-value", fn_of("pad", (2, 1, 0, 3), value=1.5), (R((2, 3, 4)),), fd=True),
    Case("pad-negative-crop", fn_of("pad", (-1, 2, 0, -2)), (R((2, 4, 5)),), fd=True),
    Case("pad-crop-only", fn_of("pad", (-1, -1, -1, 0)), (R((3, 4, 5)),)),
    Case("pad-three-dims", fn_of("pad", (1, 1, 0, 2, 1, 0)), (R((2, 3, 4)),)),
    Case("pad-1d-input", fn_of("pad", (3, 0), value=-2.0), (R((4,)),)),
    Case("pad-negative-value-crop", fn_of("pad", (-2, 1, 1, -1), value=0.5), (R((3, 4)),)),
    # ---- batch_norm (the running statistics are outputs too: updated in place)
    Case("bn-train-2d", bn(True), bn_inputs((6, 3)), bn_wrt(), fd=True),
    Case("bn-train-3d", bn(True), bn_inputs((4, 3, 5)), bn_wrt()),
    Case("bn-train-4d", bn(True), bn_inputs((2, 3, 4, 5)), bn_wrt(), fd=True),
    Case("bn-train-no-affine", bn(True, has=("rm", "rv")), bn_inputs((3, 2, 4), ("rm", "rv")),
         bn_wrt(("rm", "rv"))),
    Case("bn-train-weight-only", bn(True, has=("rm", "rv", "w")),
         bn_inputs((2, 3, 3, 2), ("rm", "rv", "w")), bn_wrt(("rm", "rv", "w"))),
    Case("bn-train-bias-only", bn(True, has=("rm", "rv", "b")),
         bn_inputs((5, 4), ("rm", "rv", "b")), bn_wrt(("rm", "rv", "b"))),
    Case("bn-train-no-running", bn(True, has=("w", "b")), bn_inputs((2, 3, 4, 4), ("w", "b")),
         bn_wrt(("w", "b")), fd=True),
    Case("bn-train-transposed-layout", bn(True), (R((3, 4, 2, 5), layout="T"), R((4,)),
                                                  R((4,), *POS), R((4,)), R((4,))), bn_wrt()),
    Case("bn-train-momentum-eps", bn(True, momentum=0.3, eps=1e-3), bn_inputs((1, 3, 2, 2)),
         bn_wrt()),
    Case("bn-eval-4d", bn(False), bn_inputs((2, 3, 4, 5)), bn_wrt(), fd=True),
    Case("bn-eval-2d-no-affine", bn(False, has=("rm", "rv")), bn_inputs((4, 3), ("rm", "rv")),
         bn_wrt(("rm", "rv"))),
    Case("bn-eval-3d-eps", bn(False, eps=0.1), bn_inputs((2, 4, 3)), bn_wrt()),
]
IDS = [c.name for c in CASES]
assert len(set(IDS)) == len(IDS)
GRAD_CASES = [c for c in CASES if c.grad]
FD_CASES = [c for c in CASES if c.fd]
LIBS = {"hn": F, "torch": TF}


def _tensors(lib, case, dtype, wrt=()):
    """(arrays, tensors of `lib`) for the case's inputs, made afresh for each library
    (batch norm updates its running statistics in place); hn tensors share the arrays'
    memory, so transposed and strided layouts reach the op as they are. Inputs in `wrt`
    require grad."""
    arrays = make_inputs(case.inputs, dtype, seed_of(case.name))
    out = []
    for i, a in enumerate(arrays):
        t = hn.from_numpy(a) if lib == "hn" else torch.from_numpy(np.array(a))
        if i in wrt:
            t.requires_grad_()
        out.append(t)
    return arrays, out


def _np(t):
    return t.detach().numpy()  # (an hn or a torch tensor)


def _dtype_name(t) -> str:
    return str(t.dtype).split(".")[-1]


def _float_inputs(case, arrays):
    if case.wrt is not None:
        return tuple(case.wrt)
    return tuple(i for i, a in enumerate(arrays) if a.dtype.kind == "f")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_matches_torch(case, dtype):
    with hn.no_grad():
        ours = flat(case.fn(F, *_tensors("hn", case, dtype)[1]))
    theirs = flat(case.fn(TF, *_tensors("torch", case, dtype)[1]))
    assert len(ours) == len(theirs)
    tol = TOL64 if dtype == np.float64 else TOL32
    for k, (o, t) in enumerate(zip(ours, theirs)):
        assert isinstance(o, hn.Tensor), type(o)
        assert o.shape == tuple(t.shape), f"output {k}: shape {o.shape} vs torch {t.shape}"
        assert _dtype_name(o) == _dtype_name(t), f"output {k}: {o.dtype} vs torch {t.dtype}"
        if t.dtype.is_floating_point:
            np.testing.assert_allclose(_np(o), _np(t), rtol=tol, atol=tol, equal_nan=True,
                                       err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(_np(o), _np(t), err_msg=f"output {k}")


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_grads_match_torch(case):
    arrays = make_inputs(case.inputs, np.float64, seed_of(case.name))
    wrt = _float_inputs(case, arrays)
    _, ht = _tensors("hn", case, np.float64, wrt)
    _, tt = _tensors("torch", case, np.float64, wrt)
    ho, to = flat(case.fn(F, *ht)), flat(case.fn(TF, *tt))
    picks = [k for k, o in enumerate(to) if o.requires_grad]
    assert picks, "no torch output requires grad"
    assert picks == [k for k, o in enumerate(ho) if o.requires_grad]
    rng = np.random.default_rng(seed_of(case.name) + 1)
    ws = [rng.standard_normal(tuple(to[k].shape)) for k in picks]
    hg = hn.grad([ho[k] for k in picks], [ht[i] for i in wrt],
                 grad_outputs=[hn.tensor(w) for w in ws], allow_unused=True)
    tg = torch.autograd.grad([to[k] for k in picks], [tt[i] for i in wrt],
                             grad_outputs=[torch.from_numpy(w) for w in ws], allow_unused=True)
    for i, g, t in zip(wrt, hg, tg):
        expected = np.zeros(arrays[i].shape) if t is None else t.numpy()
        actual = np.zeros(arrays[i].shape) if g is None else g.numpy()
        assert actual.shape == arrays[i].shape
        np.testing.assert_allclose(actual, expected, rtol=TOL64, atol=TOL64,
                                   err_msg=f"gradient of input {i}")


@pytest.mark.parametrize("case", FD_CASES, ids=[c.name for c in FD_CASES])
def test_grads_vs_finite_differences(case):
    arrays = make_inputs(case.inputs, np.float64, 0)
    check_grad(lambda *ts: case.fn(F, *ts), case.inputs, seed_of(case.name),
               wrt=list(_float_inputs(case, arrays)))


# ---- the pooling gradient of ties goes to the first maximum --------------------------------


def test_max_pool_tie_gradient_goes_to_the_first_maximum_only():
    x = hn.tensor(np.array([[[[1.0, 1.0, 0.0],
                              [1.0, 0.5, 1.0],
                              [0.0, 1.0, 1.0]]]]), requires_grad=True)
    out, idx = F.max_pool2d(x, 2, 1, return_indices=True)
    np.testing.assert_array_equal(out.detach().numpy(), np.ones((1, 1, 2, 2)))
    np.testing.assert_array_equal(idx.numpy(), [[[[0, 1], [3, 5]]]])  # first in row order
    assert idx.dtype == hn.int64 and not idx.requires_grad
    out.sum().backward()
    # windows at (0,0),(0,1),(1,0),(1,1) pick flat 0, 1, 3, 5: no split between ties
    np.testing.assert_array_equal(x.grad.numpy(), [[[[1.0, 1.0, 0.0],
                                                     [1.0, 0.0, 1.0],
                                                     [0.0, 0.0, 0.0]]]])


# ---- unfold/fold (compiler.ops_conv) against torch's unfold and fold ----------------------


@pytest.mark.parametrize("kernel, dilation, stride", [
    ((3, 3), (1, 1), (1, 1)), ((2, 3), (2, 1), (1, 2)), ((1, 1), (1, 1), (2, 3)),
    ((3, 2), (1, 2), (3, 1))], ids=["3x3", "dilated", "1x1-strided", "mixed"])
def test_unfold_and_fold_primitives_match_torch(kernel, dilation, stride):
    rng = np.random.default_rng(sum(kernel + dilation + stride))
    x = rng.standard_normal((2, 3, 8, 7))
    cols = apply("unfold", (hn.tensor(x),), {"kernel": kernel, "dilation": dilation,
                                              "stride": stride})
    ref = TF.unfold(torch.from_numpy(x), kernel, dilation=dilation, stride=stride)
    n, oh, ow, c, kh, kw = cols.shape
    assert (n, c, kh, kw) == (2, 3) + kernel and oh * ow == ref.shape[2]
    # torch's (N, C*kh*kw, L) is ours (N, OH, OW, C, kh, kw) with the window dims first
    ours = cols.numpy().reshape(n, oh * ow, c * kh * kw).transpose(0, 2, 1)
    np.testing.assert_array_equal(ours, ref.numpy())
    y = rng.standard_normal(cols.shape)
    back = apply("fold", (hn.tensor(y),), {"size": (8, 7), "kernel": kernel,
                                           "dilation": dilation, "stride": stride})
    tback = TF.fold(torch.from_numpy(y.reshape(n, oh * ow, -1).transpose(0, 2, 1).copy()),
                    (8, 7), kernel, dilation=dilation, stride=stride)
    np.testing.assert_allclose(back.numpy(), tback.numpy(), rtol=1e-12, atol=1e-12)
    # fold is unfold's adjoint: <unfold(x), y> == <x, fold(y)>
    assert np.isclose(np.sum(cols.numpy() * y), np.sum(x * back.numpy()), rtol=1e-12)


# ---- errors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Err:
    name: str
    fn: object  # fn(nnf, *tensors)
    inputs: tuple  # (shape, dtype) per input; None passes None
    exc: type
    names: tuple  # substrings the message must contain (the op, the shapes)
    torch_raises: bool = True


f32, f64, i64 = np.float32, np.float64, np.int64
X4 = ((2, 3, 5, 5), f32)
ERRORS = [
    Err("conv2d-wrong-channels", cv("conv2d"), (((2, 4, 5, 5), f32), ((6, 3, 3, 3), f32)),
        ShapeError, ("conv2d", "[2, 4, 5, 5]", "[6, 3, 3, 3]")),
    Err("conv2d-groups-wrong-channels", cv("conv2d", groups=3),
        (((1, 4, 5, 5), f32), ((6, 2, 3, 3), f32)), ShapeError,
        ("conv2d", "groups=3", "[1, 4, 5, 5]", "[6, 2, 3, 3]")),
    Err("conv2d-groups-not-dividing-out-channels", cv("conv2d", groups=4),
        (((1, 4, 5, 5), f32), ((6, 1, 3, 3), f32)), ValueError,
        ("conv2d", "groups=4", "[6, 1, 3, 3]")),
    Err("conv2d-kernel-larger-than-input", cv("conv2d"),
        (((1, 2, 3, 4), f32), ((1, 2, 5, 3), f32)), ShapeError,
        ("conv2d", "[5, 3]", "[1, 2, 3, 4]")),
    Err("conv2d-kernel-larger-than-padded-input", cv("conv2d", padding=1),
        (((1, 2, 3, 3), f32), ((1, 2, 6, 6), f32)), ShapeError,
        ("conv2d", "[6, 6]", "[1, 2, 3, 3]", "5x5")),
    Err("conv2d-dilated-kernel-too-large", cv("conv2d", dilation=2),
        (((1, 1, 4, 6), f32), ((1, 1, 3, 3), f32)), ShapeError,
        ("conv2d", "[3, 3]", "dilation [2, 2]", "[1, 1, 4, 6]")),
    Err("conv2d-2d-input", cv("conv2d"), (((5, 5), f32), ((1, 1, 3, 3), f32)), ShapeError,
        ("conv2d", "[5, 5]", "4-D")),
    Err("conv2d-5d-input", cv("conv2d"), (((1, 1, 1, 5, 5), f32), ((1, 1, 3, 3), f32)),
        ShapeError, ("conv2d", "[1, 1, 1, 5, 5]", "4-D")),
    Err("conv2d-3d-weight", cv("conv2d"), (X4, ((4, 3, 3), f32)), ShapeError,
        ("conv2d", "4-D", "4, 3, 3")),
    Err("conv2d-dtype-mismatch", cv("conv2d"), (X4, ((4, 3, 3, 3), f64)), DTypeError,
        ("conv2d", "float32[2, 3, 5, 5]", "float64[4, 3, 3, 3]")),
    Err("conv2d-bias-dtype-mismatch", cv("conv2d"), (X4, ((4, 3, 3, 3), f32), ((4,), f64)),
        DTypeError, ("conv2d", "float32[2, 3, 5, 5]", "float64[4]")),
    Err("conv2d-integer-input", cv("conv2d"), (((1, 3, 5, 5), i64), ((4, 3, 3, 3), i64)),
        DTypeError, ("conv2d", "int64[1, 3, 5, 5]"), torch_raises=False),  # torch computes it
    Err("conv2d-bias-wrong-shape", cv("conv2d"), (X4, ((4, 3, 3, 3), f32), ((5,), f32)),
        ShapeError, ("conv2d", "[5]", "[4]")),
    Err("conv2d-negative-padding", cv("conv2d", padding=-1), (X4, ((4, 3, 3, 3), f32)),
        ValueError, ("conv2d", "padding", "-1")),
    Err("conv2d-zero-stride", cv("conv2d", stride=(1, 0)), (X4, ((4, 3, 3, 3), f32)),
        ValueError, ("conv2d", "stride", "(1, 0)")),
    Err("conv2d-same-stride2", cv("conv2d", padding="same", stride=2),
        (X4, ((4, 3, 3, 3), f32)), ValueError, ("conv2d", "'same'", "strided")),
    Err("conv1d-wrong-channels", cv("conv1d"), (((2, 3, 8), f32), ((4, 2, 3), f32)),
        ShapeError, ("conv1d", "[2, 3, 8]", "[4, 2, 3]")),
    Err("conv1d-4d-input", cv("conv1d"), (((2, 3, 4, 8), f32), ((4, 3, 3), f32)), ShapeError,
        ("conv1d", "[2, 3, 4, 8]", "3-D")),
    Err("conv1d-kernel-larger-than-input", cv("conv1d"), (((2, 3, 4), f32), ((4, 3, 5), f32)),
        ShapeError, ("conv1d", "[2, 3, 4]", "[4, 3, 5]")),
    Err("conv1d-same-stride2", cv("conv1d", padding="same", stride=2),
        (((2, 3, 8), f32), ((4, 3, 3), f32)), ValueError, ("conv1d", "'same'")),
    Err("convT-wrong-channels", cv("conv_transpose2d"), (((1, 3, 4, 4), f32),
                                                         ((2, 3, 3, 3), f32)),
        ShapeError, ("conv_transpose2d", "[1, 3, 4, 4]", "[2, 3, 3, 3]")),
    Err("convT-output-padding-too-big", cv("conv_transpose2d", stride=2, output_padding=2),
        (((1, 2, 4, 4), f32), ((2, 3, 3, 3), f32)), ValueError,
        ("conv_transpose2d", "output_padding", "stride")),
    Err("convT-groups-not-dividing-in-channels", cv("conv_transpose2d", groups=2),
        (((1, 3, 4, 4), f32), ((3, 2, 3, 3), f32)), ValueError,
        ("conv_transpose2d", "groups=2", "[3, 2, 3, 3]")),
    Err("convT-dtype-mismatch", cv("conv_transpose2d"), (((1, 2, 4, 4), f64),
                                                         ((2, 3, 3, 3), f32)),
        DTypeError, ("conv_transpose2d", "float64[1, 2, 4, 4]", "float32[2, 3, 3, 3]")),
    Err("maxpool2d-padding-over-half-kernel", fn_of("max_pool2d", 3, 1, 2), (X4,), ValueError,
        ("max_pool2d", "pad", "[2, 2]", "[3, 3]")),
    Err("avgpool2d-padding-over-half-kernel", fn_of("avg_pool2d", 2, 1, (0, 2)), (X4,),
        ValueError, ("avg_pool2d", "pad", "[0, 2]", "[2, 2]")),
    Err("maxpool1d-padding-over-half-kernel", fn_of("max_pool1d", 2, 1, 2), (((2, 3, 8), f32),),
        ValueError, ("max_pool", "pad")),
    Err("maxpool2d-kernel-larger-than-input", fn_of("max_pool2d", 4), (((1, 2, 3, 5), f32),),
        ShapeError, ("max_pool2d", "[1, 2, 3, 5]")),
    Err("avgpool2d-kernel-larger-than-input", fn_of("avg_pool2d", (2, 6)), (((1, 2, 3, 5), f32),),
        ShapeError, ("avg_pool2d", "[1, 2, 3, 5]")),
    Err("maxpool2d-zero-stride", fn_of("max_pool2d", 2, 0), (X4,), ValueError,
        ("max_pool2d", "stride")),
    Err("maxpool2d-5d-input", fn_of("max_pool2d", 2), (((1, 1, 2, 4, 4), f32),), ShapeError,
        ("max_pool2d", "[1, 1, 2, 4, 4]")),
    Err("maxpool2d-integer-input", fn_of("max_pool2d", 2), (((1, 2, 4, 4), i64),), DTypeError,
        ("max_pool2d", "int64[1, 2, 4, 4]"), torch_raises=False),
    Err("batch_norm-train-one-value-per-channel", bn(True), (((1, 3), f32), ((3,), f32),
                                                             ((3,), f32), ((3,), f32),
                                                             ((3,), f32)),
        ValueError, ("batch_norm", "[1, 3]")),
    Err("batch_norm-train-one-value-per-channel-4d", bn(True, has=()),
        (((1, 2, 1, 1), f32),), ValueError, ("batch_norm", "[1, 2, 1, 1]")),
    Err("batch_norm-running-mean-wrong-shape", bn(False), (((2, 3), f32), ((4,), f32),
                                                           ((3,), f32), ((3,), f32),
                                                           ((3,), f32)),
        ShapeError, ("batch_norm", "running_mean", "[4]", "[2, 3]")),
    Err("batch_norm-weight-wrong-shape", bn(True, has=("w",)), (((4, 3, 2), f32), ((2,), f32)),
        ShapeError, ("batch_norm", "weight", "[2]", "[4, 3, 2]")),
    Err("batch_norm-eval-without-running-stats", bn(False, has=()), (((4, 3), f32),),
        ValueError, ("batch_norm", "running_mean")),
    Err("pad-odd-length", fn_of("pad", (1, 2, 3)), (((2, 3), f32),), ValueError,
        ("pad", "[2, 3]")),
    Err("pad-too-long", fn_of("pad", (1, 1, 1, 1, 1, 1)), (((2, 3), f32),), ValueError,
        ("pad", "[2, 3]")),
    Err("pad-crop-below-zero", fn_of("pad", (-2, -2)), (((2, 3), f32),), ValueError,
        ("pad", "[2, 3]")),
]


def _error_inputs(err, lib):
    out = []
    for spec in err.inputs:
        shape, dtype = spec
        a = np.ones(shape, dtype=dtype)
        out.append(hn.tensor(a) if lib == "hn" else torch.from_numpy(a))
    return out


@pytest.mark.parametrize("err", ERRORS, ids=[e.name for e in ERRORS])
def test_bad_input_raises_a_clear_error(err):
    with pytest.raises(err.exc) as info:
        err.fn(F, *_error_inputs(err, "hn"))
    msg = str(info.value)
    missing = [s for s in err.names if s not in msg]
    assert not missing, f"message {msg!r} does not name {missing}"
    if err.torch_raises:
        with pytest.raises((RuntimeError, ValueError, TypeError, IndexError)):
            err.fn(TF, *_error_inputs(err, "torch"))


def test_pad_reflect_mode_is_refused_by_name():
    with pytest.raises(NotImplementedError, match=re.escape("'reflect'")):
        F.pad(hn.ones(1, 2, 3), (1, 1), mode="reflect")


def test_max_pool_window_with_two_nans_picks_the_first_nan():
    """A documented difference (docs/conv.md): the value is NaN as in PyTorch, but the
    index (and so the gradient) goes to the first NaN of the window, as argmax finds it;
    PyTorch's CPU kernel lets each NaN replace the previous one and picks the last."""
    x = hn.tensor(np.array([[[[1.0, np.nan, 0.0, np.nan], [0.0, 1.0, 2.0, 3.0]]]]),
                  requires_grad=True)
    out, idx = F.max_pool2d(x, (1, 4), return_indices=True)
    assert np.isnan(out.detach().numpy()[0, 0, 0, 0]) and out.detach().numpy()[0, 0, 1, 0] == 3
    assert idx.numpy().ravel().tolist() == [1, 7]
    out.sum().backward()
    assert x.grad.numpy().ravel().tolist() == [0, 1, 0, 0, 0, 0, 0, 1]
