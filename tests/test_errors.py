"""Bad input raises clear exceptions naming the op, shapes and dtypes."""

import numpy as np
import pytest

import hybridnet as hn
import hybridnet.nn.functional as F
from compiler.errors import DTypeError, OpError, ShapeError
from compiler.ops import REGISTRY


@pytest.mark.parametrize("fn, pattern", [
    (lambda: hn.randn(3) + hn.randn(4), r"add: shapes are not broadcastable: float32\[3\], "
                                       r"float32\[4\]"),
    (lambda: hn.randn(2, 3) * hn.randn(3, 2), r"mul: .*float32\[2, 3\], float32\[3, 2\]"),
    (lambda: hn.randn(2, 3) @ hn.randn(2, 3), r"matmul: .*\[2, 3\]"),
    (lambda: hn.randn(2, 3).reshape(4, 2), r"reshape: cannot reshape .*\[2, 3\].*\[4, 2\]"),
    (lambda: hn.randn(2, 3).sum(2), r"sum: dim 2 is out of range .*\[2, 3\]"),
    (lambda: hn.randn(2, 3).permute(0, 0), r"permute: .*not a permutation"),
    (lambda: hn.cat([hn.randn(2, 3), hn.randn(2, 4)], 0), r"cat: sizes must match"),
    (lambda: hn.stack([hn.randn(2), hn.randn(3)]), r"stack: all tensors must have the same"),
    (lambda: hn.randn(2, 3).expand(4, 3), r"expand: cannot expand"),
    (lambda: hn.randn(0).amax(), r"max: cannot reduce a size-0 dim"),
    (lambda: F.linear(hn.randn(2, 3), hn.randn(4, 5)), r"linear: input .*\[2, 3\]"),
    (lambda: F.mse_loss(hn.randn(4, 1), hn.randn(4)), r"mse_loss: .*same shape"),
])
def test_shape_errors_name_op_and_shapes(fn, pattern):
    with pytest.raises(ShapeError, match=pattern):
        fn()


@pytest.mark.parametrize("fn, pattern", [
    (lambda: hn.where(hn.tensor([1.0]), 1.0, 2.0), r"where: condition must be a bool"),
    (lambda: -hn.tensor([True]), r"neg: not supported on bool"),
    (lambda: hn.tensor([1, 2]).mean(), r"mean\(\): expected a floating-point input"),
    (lambda: F.cross_entropy(hn.randn(2, 3), hn.tensor([0.0, 1.0])), r"integer tensor"),
    (lambda: hn.tensor([1, 2]).add_(1.5), r"add_: result type float32 can't be cast"),
])
def test_dtype_errors(fn, pattern):
    with pytest.raises(DTypeError, match=pattern):
        fn()


def test_errors_are_runtime_and_value_errors():
    with pytest.raises(RuntimeError):
        hn.randn(3) + hn.randn(4)
    with pytest.raises(ValueError):
        hn.randn(3) + hn.randn(4)


def test_wrong_number_of_inputs_to_a_primitive():
    with pytest.raises(OpError, match=r"add: expected 2 inputs, got 1"):
        REGISTRY["add"].check([(3,)], [np.dtype("float32")], {})


def test_wrong_number_of_args_to_functions():
    with pytest.raises(TypeError):
        hn.exp(hn.randn(2), hn.randn(2))
    with pytest.raises(TypeError):
        hn.nn.Linear(3)


def test_unsupported_operand_type():
    with pytest.raises(TypeError, match="add: unsupported operand type str"):
        hn.randn(2) + "a"


def test_backward_twice_names_op():
    x = hn.randn(3, requires_grad=True)
    y = (x.exp() * 2.0).sum()
    y.backward()
    with pytest.raises(RuntimeError, match=r"second time \(op '(sum|mul|exp)'.*retain_graph"):
        y.backward()


def test_backward_on_non_scalar_without_gradient():
    x = hn.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"only for scalar outputs; output 0 has shape \[3\]"):
        (x * 2.0).backward()


def test_backward_with_wrong_gradient_shape():
    x = hn.randn(3, requires_grad=True)
    with pytest.raises(ShapeError, match=r"gradient has shape \[2\] but the output has shape"):
        (x * 2.0).backward(hn.ones(2))


def test_backward_on_tensor_without_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        hn.randn(3).sum().backward()


@pytest.mark.parametrize("dtype", [hn.int64, hn.int32, hn.bool])
def test_int_and_bool_tensors_cannot_require_grad(dtype):
    with pytest.raises(RuntimeError, match=f"only floating-point.*{dtype}"):
        hn.zeros(2, dtype=dtype, requires_grad=True)
    with pytest.raises(RuntimeError, match="only floating-point"):
        hn.zeros(2, dtype=dtype).requires_grad_()


def test_numpy_on_tensor_requiring_grad_points_at_detach():
    x = hn.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"detach\(\)\.numpy\(\)"):
        x.numpy()
    with pytest.raises(RuntimeError):
        np.asarray(x)
    assert np.asarray(x.detach()).shape == (2,)


def test_item_bool_and_len_errors():
    with pytest.raises(ValueError, match="3 elements"):
        hn.randn(3).item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(hn.randn(3))
    with pytest.raises(TypeError, match="0-d"):
        len(hn.tensor(1.0))


def test_index_errors():
    x = hn.randn(3, 4)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dim 0 with size 3"):
        x[3]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(IndexError, match="out of bounds"):
        x[hn.tensor([0, 5])]
    with pytest.raises(IndexError, match="integer or bool"):
        x[hn.tensor([0.5])]


def test_setitem_under_autograd_is_refused_with_advice():
    x = hn.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        x[0] = 1.0
    with hn.no_grad():
        x[0] = 1.0
    assert x.detach().numpy()[0] == 1.0


def test_unsupported_dtype_is_rejected():
    with pytest.raises(TypeError, match="not supported"):
        hn.tensor(np.zeros(2, np.float16))
    with pytest.raises(TypeError, match="not supported"):
        hn.zeros(2, dtype="complex64")
    with pytest.raises(TypeError, match="cannot build a tensor"):
        hn.tensor(["a", "b"])


def test_interpreter_errors_name_the_node_op_shapes_and_dtypes():
    with hn.record() as rec:
        hn.ones(2, 3) @ hn.ones(3, 4)
    graph = rec.graph
    graph.inputs[1].shape = (5, 4)  # a graph whose matmul cannot run on these inputs
    with pytest.raises(OpError) as info:
        graph.run(np.ones((2, 3), np.float32), np.ones((5, 4), np.float32))
    text = str(info.value)
    assert "%2 = matmul(%0, %1) : float32[2, 4]" in text
    assert "'matmul'" in text and "float32[2, 3], float32[5, 4]" in text


def test_executor_errors_name_the_kernel_and_inputs():
    from runtime.executor import Executable

    class Broken:
        filename = "<kernel k_test>"
        compiled = True
        program = None

        def __call__(self, *arrays):
            raise IndexError("index 7 is out of bounds")

    exe = Executable(Broken(), 1, [], [], [])
    exe.plain = False
    with pytest.raises(IndexError, match="index 7") as info:  # its own type, as in eager
        exe.run([np.ones(3, np.float32)])
    assert any("k_test" in n and "float32[3]" in n for n in info.value.__notes__)
