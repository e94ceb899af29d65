"""The op registry's machinery: `OpDef`, traits, `register`, and shared helpers.

Each primitive is declared once (see `compiler.ops`): name, arity, attribute
names, a shape/dtype rule, a NumPy `impl`, a vjp written with ops, which saved
values its vjp reads, and traits. Passes query traits, never names.
"""

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import DTypeError, OpError, ShapeError, describe


class Trait:
    """Trait names that passes and the autodiff engine query."""

    ELEMENTWISE = "elementwise"  # out[i] depends on in[i] only; broadcasts implicitly
    REDUCTION = "reduction"  # folds `dims` away
    MOVEMENT = "movement"  # rearranges or selects elements, no arithmetic
    COMMUTATIVE = "commutative"
    PURE = "pure"  # no side effects, deterministic: safe to CSE and constant-fold
    FLOAT_ONLY = "float_only"  # integer/bool inputs are promoted to the default float
    COMPARISON = "comparison"  # bool output, no gradient
    SOURCE = "source"  # graph leaves: inputs and constants
    BROADCAST = "broadcast"  # out[i] is the input read at i with broadcasting (expand, detach)
    ARG_REDUCTION = "arg_reduction"  # a reduction to the index of an extreme (argmax)
    CONTROL = "control"  # structured control flow made by passes (loops over a body graph)


@dataclass(frozen=True, eq=False)
class OpDef:
    """One primitive op.

    `vjp` is a tuple with one rule per input (None where the input takes no
    gradient), each `rule(e, g, ins, out, attrs) -> grad`, or for a variadic op a
    single callable returning a tuple. `e(op_name, *values, **attrs)` applies an op
    to whatever values it is given: eager tensors, graph values, or tensors with
    history (for higher-order gradients); Python scalars take the dtype of the
    first non-bool operand.
    """

    name: str
    arity: int  # -1: variadic
    impl: Callable
    infer: Callable  # (shapes, dtypes, **attrs) -> (shape, dtype); raises OpError
    vjp: object = None
    attrs: tuple = ()
    traits: frozenset = field(default_factory=frozenset)
    saves: frozenset = frozenset({"in"})  # which values the vjp reads: "in", "out"
    doc: str = ""
    # Algebraic facts the simplifier uses (passes ask these, never op names):
    identity: object = None  # v with op(x, v) == x (and op(v, x) == x if commutative)
    involution: bool = False  # op(op(x)) == x
    # compose(outer_attrs, inner_attrs) -> attrs with op(op(x, inner), outer) == op(x, attrs)
    compose: Callable = None
    is_identity: Callable = None  # is_identity(attrs) -> True when op(x, attrs) == x
    noop_same_type: bool = False  # computes exactly its operand when types match
    # swaps_last_two(attrs) -> True when the op (a movement) swaps the last two dims only
    swaps_last_two: Callable = None
    # op(a, b) with its last two dims swapped == op(b', a') with its operands' swapped
    transpose_swaps: bool = False
    # A matrix product a @ b: each row of its 2-D result is a row of a times b
    # (compiler.loop_hoist moves such products out of loops)
    product: bool = False
    # The same elements in row-major order, in another shape (a reshape)
    regroups: bool = False
    # For a REDUCTION that folds values (sum, max, min): how it combines them ("add",
    # "max", "min") and where it starts ("zero", "lowest", "highest").
    combine: str = None
    initial: str = None
    # infer_node(node) -> (shape, dtype), for ops whose type depends on more than their
    # operands' types (a loop's projections: on the loop's attributes)
    infer_node: Callable = None
    # What loop rerolling asks of an op (compiler.reroll): window "read" when it takes the
    # window `index` of its operand (slice), "write" when it writes its operand into the
    # window `index` of zeros (pad_slice); `joins`: it concatenates its operands along
    # `dim` (cat); `sums`: elementwise a + b (how gradients accumulate)
    window: str = None
    joins: bool = False
    sums: bool = False
    # Which zero operands make the result zero (compiler.reroll_peel): "any" (x * 0,
    # x @ 0), "first" (0 / x, a movement or sum of zeros, take from zeros), "all" (0 + 0,
    # a cat of zeros); None: no such fact
    zeros: str = None
    # refuse(node) -> why no backend may compile this node (its run-time check is eager's
    # alone: an integer power's negative exponent raises), or None
    refuse: Callable = None

    @property
    def differentiable(self) -> bool:
        """True when gradients flow through this op."""
        return self.vjp is not None

    def has(self, trait: str) -> bool:
        """True when the op carries `trait`."""
        return trait in self.traits

    def check(self, shapes, dtypes, attrs) -> tuple:
        """Run the shape/dtype rule, checking arity first."""
        if self.arity >= 0 and len(shapes) != self.arity:
            raise OpError(
                f"{self.name}: expected {self.arity} inputs, got {len(shapes)} "
                f"({describe(shapes, dtypes)})"
            )
        return self.infer(shapes, dtypes, **attrs)

    def __repr__(self) -> str:
        return f"OpDef({self.name!r})"


REGISTRY: dict[str, OpDef] = {}


def lowering_refusal(node) -> str | None:
    """Why no backend may compile `node` (OpDef.refuse), or None."""
    refuse = REGISTRY[node.op].refuse
    return None if refuse is None else refuse(node)


def register(op: OpDef) -> OpDef:
    """Add `op` to the registry; names are unique."""
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} registered twice")
    REGISTRY[op.name] = op
    return op


def get(name: str) -> OpDef:
    """Look up a primitive by name, with a clear error for unknown names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise OpError(f"unknown op {name!r}; known ops: {', '.join(sorted(REGISTRY))}") from None


# ---- shape-rule helpers -------------------------------------------------------------


def broadcast_shapes(op: str, shapes, dtypes) -> tuple:
    """NumPy broadcasting of `shapes`, raising ShapeError naming `op`."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, ndim - len(shape)):
            if size != 1:
                if out[i] != 1 and out[i] != size:
                    raise ShapeError(
                        f"{op}: shapes are not broadcastable: {describe(shapes, dtypes)}"
                    )
                out[i] = size
    return tuple(out)


def same_dtype(op: str, shapes, dtypes) -> np.dtype:
    """The single dtype shared by all operands (the tensor layer promotes first)."""
    first = dtypes[0]
    for dt in dtypes[1:]:
        if dt != first:
            raise DTypeError(
                f"{op}: operands must share one dtype, got {describe(shapes, dtypes)}"
            )
    return first


def check_dims(op: str, dims, ndim: int, shape=(), dtype="") -> tuple:
    """Validate normalized reduction dims (non-negative, unique, in range)."""
    for d in dims:
        if not 0 <= d < max(ndim, 1):
            raise ShapeError(f"{op}: dim {d} out of range for {dtype}{list(shape)}")
    if len(set(dims)) != len(dims):
        raise ShapeError(f"{op}: repeated dim in {dims}")
    return tuple(dims)


def reduced_shape(shape, dims, keepdim: bool) -> tuple:
    """Shape after reducing `dims`."""
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


# ---- vjp helpers (written with ops, so they run on any value kind) -------------------


def sum_to(e, g, shape):
    """Sum `g` down to `shape`, undoing NumPy broadcasting."""
    gshape = tuple(g.shape)
    shape = tuple(shape)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    dims = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and gshape[lead + i] != 1
    )
    if dims:
        g = e("sum", g, dims=dims, keepdim=True)
    if tuple(g.shape) != shape:
        g = e("reshape", g, shape=shape)
    return g


def zeros_like(e, x):
    """A zero value with x's shape and dtype, written with ops."""
    return e("expand", e.const(0, like=x), shape=tuple(x.shape))
