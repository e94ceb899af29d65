"""Autograd: backward, hn.grad, grad-mode switches, and access to the recorded graph."""

import functools

import numpy as np

from compiler import autodiff
from compiler.errors import ShapeError
from compiler.ir import Graph

from ._state import STATE
from .dispatch import CLOSED, EMIT, SUMMING, cast, node_of
from .fused import unfuse
from .tensor import Tensor, literal, make, version_counter, wrap


class _GradMode:
    """Base for no_grad / enable_grad: a context manager and a decorator."""

    enabled = True

    def __enter__(self):
        self._prev = STATE.grad
        STATE.grad = self.enabled

    def __exit__(self, *exc):
        STATE.grad = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):  # noqa: N801  (PyTorch's name)
    """Disable gradient recording: `with hn.no_grad(): ...` or `@hn.no_grad()`."""

    enabled = False


class enable_grad(_GradMode):  # noqa: N801
    """Re-enable gradient recording inside a no_grad block."""

    enabled = True


class set_grad_enabled(_GradMode):  # noqa: N801
    """Set grad mode to `mode` for a block."""

    def __init__(self, mode: bool):
        self.enabled = bool(mode)

    def __call__(self, fn):
        raise TypeError("use set_grad_enabled as a context manager")


def is_grad_enabled() -> bool:
    """True when grad mode is on."""
    return STATE.grad


# ---- the engine's callbacks ---------------------------------------------------------------


def _check_saved(node):
    for n in (node, *node.inputs):
        if n.value is None:
            raise RuntimeError(
                f"Trying to backward through the graph a second time (op '{n.op}', output "
                f"{n.type_str()}): its saved values were freed by the first backward(). "
                "Pass retain_graph=True to the first backward() if you need to do this.")
    for vc, version in node.saved:
        if vc[0] != version:
            raise RuntimeError(
                f"one of the values needed for gradient computation has been modified by an "
                f"in-place operation: an input or output of '{node.op}' (output "
                f"{node.type_str()}) is at version {vc[0]}; expected version {version}")


def _value_of(create_graph):
    if create_graph:
        return lambda node: make(node.value, node.requires_grad, node)
    if STATE.tracer is not None:  # the backward's ops read the forward's recorded values
        return lambda node: make(node.value, False, node)
    return lambda node: wrap(node.value)


def _root_grads(outputs, grad_outputs, op_name):
    grads = []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs)):
        if not out._rg or out._node is None:
            raise RuntimeError(f"{op_name}: element {i} of tensors does not require grad and "
                               f"does not have a grad_fn (shape {list(out.shape)})")
        if g is None:
            if out._data.size != 1:
                raise RuntimeError(
                    f"{op_name}: grad can be implicitly created only for scalar outputs; "
                    f"output {i} has shape {list(out.shape)} (from '{out._node.op}'); pass "
                    f"gradient= of that shape")
            g = literal(np.ones(out.shape, out._data.dtype))
        else:
            g = g if isinstance(g, Tensor) else literal(np.asarray(g, out._data.dtype))
            if g.shape != out.shape:
                raise ShapeError(f"{op_name}: gradient has shape {list(g.shape)} but the output "
                                 f"has shape {list(out.shape)} (from '{out._node.op}')")
            if g._data.dtype != out._data.dtype:
                with no_grad():
                    g = cast(g, out._data.dtype)
        grads.append(g)
    return grads


def _run(outputs, grad_outputs, sink, retain_graph, create_graph, op_name):
    outputs = list(outputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    roots = _root_grads(outputs, list(grad_outputs), op_name)
    # Gradient rules may meet inf * 0 at the edges of a function's domain (d/dy x**y at
    # x = 0): the result is masked, so NumPy's warnings are noise here, as in PyTorch.
    with set_grad_enabled(create_graph), np.errstate(all="ignore"):
        emit = SUMMING if not create_graph and STATE.tracer is None and \
            not STATE.recorders else EMIT
        order = autodiff.backward([o._node for o in outputs], roots, emit,
                                  _value_of(create_graph), sink, _check_saved)
    if STATE.tracer is not None:
        _check_traced_walk(order, create_graph, op_name)
    if not retain_graph:
        for node in order:
            if isinstance(node, autodiff.OwnBackward):
                node.release()
            elif node.op != "input":
                node.value = None
    return order


def backward(tensor, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate d(tensor)/d(leaf) into each leaf's `.grad`."""
    retain = create_graph if retain_graph is None else retain_graph
    wanted = None if inputs is None else {id(node_of(t)) for t in inputs}

    def sink(node, g):
        if node.op != "input" or (wanted is not None and id(node) not in wanted):
            return
        leaf = node.ref() if node.ref is not None else None
        if leaf is not None:
            _accumulate(leaf, g, create_graph)

    _run([tensor], [gradient], sink, retain, create_graph, "backward")


def _check_traced_walk(order, create_graph, op_name):
    """backward() inside a traced call replays only if its walk stayed inside the call
    (leaves aside) and built no graph of its own."""
    tracer = STATE.tracer
    if create_graph:
        tracer.untraceable(f"{op_name}(create_graph=True) inside the call: higher-order "
                           "gradients run eagerly")
        return
    recorded = {id(n) for n in tracer.nodes}
    if any(n.op != "input" and id(n) not in recorded for n in order):
        tracer.untraceable(f"{op_name}() inside the call reaches autograd history made "
                           "before the call (an argument with a grad_fn)")


def _accumulate(leaf, g, create_graph):
    """Add `g` into `leaf.grad` as PyTorch's AccumulateGrad does: a copy the first time,
    in place after that (bumping the grad's version), out of place when the grad has
    history or another shape. Inside a traced call the same steps run as recorded ops."""
    if create_graph:
        leaf._grad = g if leaf._grad is None else leaf._grad + g
        return
    if STATE.tracer is not None:
        STATE.tracer.accumulate_grad(leaf, g)
        return
    data = g._data
    if leaf._grad is None:  # laid out as the leaf (PyTorch's layout contract): a weight
        # used as W.T gets its gradient as a transposed view, and an update reading a
        # transposed .grad against a row-major parameter ran 4x slower
        flags = leaf._data.flags  # (a leaf that is not dense gets a row-major .grad)
        buf = np.empty_like(leaf._data) if leaf._data.shape == data.shape and (
            flags.c_contiguous or flags.f_contiguous) else np.empty(data.shape, leaf._data.dtype)
        np.copyto(buf, data, casting="unsafe")
        leaf._grad = wrap(buf)
    elif leaf._grad._rg or leaf._grad._data.shape != data.shape:
        leaf._grad = wrap(leaf._grad._data + data)
    else:
        leaf._grad._data += data
        version_counter(leaf._grad)[0] += 1


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    """Gradients of `outputs` with respect to `inputs`, without touching `.grad`."""
    single_out = isinstance(outputs, Tensor)
    outputs = [outputs] if single_out else list(outputs)
    single_in = isinstance(inputs, Tensor)
    inputs = [inputs] if single_in else list(inputs)
    if grad_outputs is not None and isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    for i, t in enumerate(inputs):
        if not t._rg:
            raise RuntimeError(f"grad: input {i} (shape {list(t.shape)}) does not require grad")
    targets = {}  # node id -> the positions of `inputs` it is (a tensor may repeat)
    for i, t in enumerate(inputs):
        targets.setdefault(id(node_of(t)), []).append(i)
    found = [None] * len(inputs)

    def sink(node, g):
        slots = targets.get(id(node))
        if slots is not None:
            # (inside a traced call: the recorded value itself, which the trace can replay)
            g = g if create_graph or STATE.tracer is not None else wrap(g._data)
            for i in slots:
                found[i] = g

    retain = create_graph if retain_graph is None else retain_graph
    _run(outputs, grad_outputs, sink, retain, create_graph, "grad")
    for i, g in enumerate(found):
        if g is None and not allow_unused:
            raise RuntimeError(f"grad: input {i} (shape {list(inputs[i].shape)}) was not used "
                               "to compute the outputs; pass allow_unused=True to get None")
    return tuple(found)


# ---- the recorded graph -----------------------------------------------------------------


class Recorder:
    """`with hn.record() as g:` records every op run inside, grad or not.

    After the block, `g.graph` is the `hn.Graph` of what ran: its inputs are the
    leaves used, its outputs the values no recorded op consumed.
    """

    def __init__(self):
        self.nodes = []
        self._rebound = []
        self._graph = None

    def append(self, node):
        self.nodes.append(node)

    def rebind(self, tensor, previous):
        """Note that an in-place op moved `tensor` off `previous` (undone on exit)."""
        self._rebound.append((tensor, previous))

    def __enter__(self):
        STATE.recorders.append(self)
        return self

    def __exit__(self, *exc):
        STATE.recorders.remove(self)
        if not STATE.recorders:  # tensors made inside carry no history out of the block
            for node in self.nodes:
                if not node.requires_grad and node.op not in ("input", "const"):
                    node.ref = CLOSED
        for tensor, _previous in self._rebound:
            node = tensor._node
            if node is not None and not node.requires_grad:
                tensor._node = None  # a fresh leaf next time: recording must not leak
        self._rebound.clear()
        return False

    @property
    def graph(self) -> Graph:
        """The recorded `hn.Graph`."""
        if self._graph is None:
            self._graph = _graph_of_recorded(self.nodes)
        return self._graph


def _graph_of_recorded(nodes) -> Graph:
    used = set()
    for node in nodes:
        used.update(id(i) for i in node.inputs)
    outputs = [n for n in nodes if id(n) not in used]
    return Graph.from_outputs(unfuse(outputs))


def record() -> Recorder:
    """Record every op run inside the block: `with hn.record() as g: ...; g.graph`."""
    return Recorder()


def graph_of(*tensors) -> Graph:
    """The `hn.Graph` that produced `tensors` (leaves without history are its inputs)."""
    if not tensors:
        raise ValueError("graph_of: pass at least one tensor")
    return Graph.from_outputs(unfuse([node_of(t) for t in tensors]))
