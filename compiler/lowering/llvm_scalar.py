"""The llvm backend's lowering table: one IR rule per elementwise op, plus casts,
constants and the reductions' combine steps.

A rule takes the builder, the operand values (already converted to the type the op
computes in), the node and the emitter, and returns an IR value. Floats are computed with
the flags the Numba backend uses ('reassoc', 'contract'; never 'nnan'/'ninf'/'nsz'), so
both backends round alike; float32 exp/log/tanh/sigmoid/erf are the IR functions of
compiler.lowering.llvm_math, float64 ones libm (through LLVM intrinsics where LLVM has one).
Bools are i1 in registers and one byte in memory, as NumPy stores them.
"""

import numpy as np
from llvmlite import ir

from ..errors import LoweringError
from ..registry import REGISTRY, Trait
from . import llvm_math

FAST = ("reassoc", "contract")
I1, I8, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)


def ir_type(dtype, memory=False):
    """The IR type of a value of `dtype` (bool: i1 in registers, i8 in memory)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return ir.FloatType()
    if dtype == np.float64:
        return ir.DoubleType()
    if dtype.kind == "b":
        return I8 if memory else I1
    if dtype.kind in "iu":
        return ir.IntType(dtype.itemsize * 8)
    raise LoweringError(f"the llvm backend has no type for {dtype}")


def constant(value, dtype):
    """An IR constant of `dtype` (the register type)."""
    dtype = np.dtype(dtype)
    v = dtype.type(value).item()
    return ir.Constant(ir_type(dtype), float(v) if dtype.kind == "f" else int(v))


def convert(b, value, src, dst):
    """`value` (register type of `src`) as `dst`, as NumPy's astype converts."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst:
        return value
    to = ir_type(dst)
    if dst.kind == "b":
        if src.kind == "f":
            return b.fcmp_unordered("!=", value, ir.Constant(value.type, 0.0))
        return b.icmp_unsigned("!=", value, ir.Constant(value.type, 0))
    if src.kind == "b":
        return b.uitofp(value, to) if dst.kind == "f" else b.zext(value, to)
    if src.kind == "f" and dst.kind == "f":
        return b.fpext(value, to) if dst.itemsize > src.itemsize else b.fptrunc(value, to)
    if src.kind == "f":
        return _float_to_int(b, value, to, unsigned=dst.kind == "u")
    if dst.kind == "f":
        return b.sitofp(value, to) if src.kind == "i" else b.uitofp(value, to)
    if dst.itemsize < src.itemsize:
        return b.trunc(value, to)
    if dst.itemsize > src.itemsize:
        return b.sext(value, to) if src.kind == "i" else b.zext(value, to)
    return value


def _float_to_int(b, value, to, unsigned=False):
    """float -> integer as NumPy does on x86 (cvttss2si/cvttsd2si): truncation toward
    zero, and the 'integer indefinite' INT_MIN of the conversion's width for nan, inf and
    values out of range (a bare fptosi would be poison there, which LLVM may fold into
    anything), then narrowed. The width is 32 bits for int8/16/32 and uint8/16 (int32's
    INT_MIN, narrowed: 0), 64 for int64, uint32 and uint64 (whose out-of-range values
    NumPy leaves to the C compiler: they may differ from eager's)."""
    bits = 32 if to.width < 32 or (to.width == 32 and not unsigned) else 64
    wide_ty = ir.IntType(bits)
    lo = ir.Constant(value.type, -2.0 ** (bits - 1))
    hi = ir.Constant(value.type, 2.0 ** (bits - 1))
    ok = b.and_(b.fcmp_ordered(">=", value, lo), b.fcmp_ordered("<", value, hi))
    safe = b.select(ok, value, ir.Constant(value.type, 0.0))
    wide = b.select(ok, b.fptosi(safe, wide_ty), ir.Constant(wide_ty, -2 ** (bits - 1)))
    return wide if to.width == bits else b.trunc(wide, to)


def to_memory(b, value, dtype):
    """A register value as it is stored (bools widen to one byte)."""
    return b.zext(value, I8) if np.dtype(dtype).kind == "b" else value


def from_memory(b, value, dtype):
    """A stored value in registers (a bool byte is true when it is not 0, as NumPy reads
    it, not only its low bit)."""
    if np.dtype(dtype).kind == "b":
        return b.icmp_unsigned("!=", value, ir.Constant(I8, 0))
    return value


def _intrinsic(b, name, args):
    ty = args[0].type
    fnty = ir.FunctionType(ty, [ty] * len(args))
    return b.call(b.module.declare_intrinsic(name, [ty], fnty), args)


def _libm(b, name, args):
    ty = args[0].type
    symbol = name if isinstance(ty, ir.DoubleType) else name + "f"
    fn = b.module.globals.get(symbol)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ty, [ty]), symbol)
    return b.call(fn, args)


def _math(name, intrinsic=None):
    def rule(b, a, node, em):
        if node.dtype == np.float32 and name in llvm_math.NAMES:
            return b.call(llvm_math.function(b.module, name), a)
        if intrinsic:
            return _intrinsic(b, intrinsic, a)
        return _libm(b, name, a)
    return rule


_BOOL_ARITH = {"add": "or_", "mul": "and_"}  # NumPy: bool + bool is or, bool * bool and


def _arith(fop, iop):
    def rule(b, a, node, em):
        if node.dtype.kind == "f":
            return getattr(b, fop)(a[0], a[1], flags=FAST)
        if node.dtype.kind == "b":
            if node.op not in _BOOL_ARITH:
                raise LoweringError(f"{node.op} on bool is run eagerly")
            return getattr(b, _BOOL_ARITH[node.op])(a[0], a[1])
        return getattr(b, iop)(a[0], a[1])
    return rule


def _compare(symbol):
    def rule(b, a, node, em):
        if a[0].type in (ir.FloatType(), ir.DoubleType()):
            # NumPy: every comparison with nan is False except !=
            if symbol == "!=":
                return b.fcmp_unordered(symbol, a[0], a[1])
            return b.fcmp_ordered(symbol, a[0], a[1])
        signed = np.dtype(compute_dtypes(node)[0]).kind == "i"
        return (b.icmp_signed if signed else b.icmp_unsigned)(symbol, a[0], a[1])
    return rule


def _extremum(symbol):
    """maximum/minimum propagating nan: a if (a > b or a != a) else b."""
    def rule(b, a, node, em):
        kind = node.dtype.kind
        if kind == "f":
            pick = b.or_(b.fcmp_ordered(symbol, a[0], a[1]),
                         b.fcmp_unordered("!=", a[0], a[0]))
        else:
            pick = (b.icmp_signed if kind == "i" else b.icmp_unsigned)(symbol, a[0], a[1])
        return b.select(pick, a[0], a[1])
    return rule


def _neg(b, a, node, em):
    if node.dtype.kind == "f":
        return b.fneg(a[0], flags=FAST)
    if node.dtype.kind == "b":
        raise LoweringError("neg on bool is run eagerly")
    return b.neg(a[0])


def _abs(b, a, node, em):
    kind = node.dtype.kind
    if kind == "f":
        return _intrinsic(b, "llvm.fabs", a)
    if kind in "bu":
        return a[0]
    neg = b.icmp_signed("<", a[0], ir.Constant(a[0].type, 0))
    return b.select(neg, b.neg(a[0]), a[0])


def _sign(b, a, node, em):
    kind, x = node.dtype.kind, a[0]
    if kind == "b":
        return x
    one, zero = constant(1, node.dtype), constant(0, node.dtype)
    if kind == "f":
        pos, neg = b.fcmp_ordered(">", x, zero), b.fcmp_ordered("<", x, zero)
        nan = b.fcmp_unordered("!=", x, x)
        inner = b.select(nan, x, zero)
        return b.select(pos, one, b.select(neg, b.fneg(one), inner))
    if kind == "u":
        return b.select(b.icmp_unsigned(">", x, zero), one, zero)
    pos, neg = b.icmp_signed(">", x, zero), b.icmp_signed("<", x, zero)
    return b.select(pos, one, b.select(neg, constant(-1, node.dtype), zero))


def _sigmoid(b, a, node, em):
    if node.dtype == np.float32:
        return b.call(llvm_math.function(b.module, "sigmoid"), a)
    one = ir.Constant(a[0].type, 1.0)
    e = _intrinsic(b, "llvm.exp", [b.fneg(a[0], flags=FAST)])
    return b.fdiv(one, b.fadd(one, e, flags=FAST), flags=FAST)


def _pow(b, a, node, em):
    if node.dtype.kind != "f":
        raise LoweringError(f"pow on {node.dtype} is run eagerly by the llvm backend")
    return _intrinsic(b, "llvm.pow", a)


def _same(b, a, node, em):
    return a[0]


RULES = {
    "add": _arith("fadd", "add"), "sub": _arith("fsub", "sub"),
    "mul": _arith("fmul", "mul"), "div": _arith("fdiv", "sdiv"), "pow": _pow,
    "lt": _compare("<"), "le": _compare("<="), "gt": _compare(">"), "ge": _compare(">="),
    "eq": _compare("=="), "ne": _compare("!="),
    "maximum": _extremum(">"), "minimum": _extremum("<"),
    "neg": _neg, "abs": _abs, "sign": _sign, "sigmoid": _sigmoid,
    "exp": _math("exp", "llvm.exp"), "log": _math("log", "llvm.log"),
    "sqrt": _math("sqrt", "llvm.sqrt"), "sin": _math("sin", "llvm.sin"),
    "cos": _math("cos", "llvm.cos"), "tanh": _math("tanh"), "erf": _math("erf"),
    "where": lambda b, a, node, em: b.select(a[0], a[1], a[2]),
    "cast": _same, "detach": _same, "expand": _same,
}


def compute_dtypes(node) -> list:
    """The dtype each operand is converted to before the rule runs."""
    ins = [i.dtype for i in node.inputs]
    if node.op == "where":
        return [np.dtype(bool), node.dtype, node.dtype]
    if node.op == "cast":
        return [ins[0]]  # (converted by the caller after the rule)
    if REGISTRY[node.op].has(Trait.COMPARISON):
        common = np.result_type(*ins)
        return [common] * len(ins)
    return [node.dtype] * len(ins)


def combine(b, node, acc, v, dtype):
    """One accumulation step of reduction `node` (sum, max, min) on register values of
    `dtype` (the accumulator's)."""
    kind = REGISTRY[node.op].combine
    if kind == "add":
        if isinstance(acc.type, (ir.FloatType, ir.DoubleType)):
            return b.fadd(acc, v, flags=FAST)
        if acc.type == I1:  # (a bool sum is NumPy's logical or: add on i1 is xor)
            return b.or_(acc, v)
        return b.add(acc, v)
    if isinstance(acc.type, (ir.FloatType, ir.DoubleType)):
        pick = b.or_(b.fcmp_ordered(">" if kind == "max" else "<", v, acc),
                     b.fcmp_unordered("!=", v, v))
    elif acc.type == I1:
        pick = b.icmp_unsigned(">" if kind == "max" else "<", v, acc)
    else:
        pick = (b.icmp_signed if np.dtype(dtype).kind == "i" else b.icmp_unsigned)(
            ">" if kind == "max" else "<", v, acc)
    return b.select(pick, v, acc)
