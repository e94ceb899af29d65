"""Float32 exp, log, tanh, sigmoid and erf as LLVM IR, for the llvm backend.

The same algorithms and coefficients as the Numba versions (compiler.lowering.mathlib,
whose docstrings give the methods): range reduction, a minimax polynomial, exponent-field
arithmetic and selects, with no call and no branch, so a loop applying them vectorizes.
Each function is emitted once per module as an `internal alwaysinline` function
`hn.<name>.f32` that the element loops call. Every float instruction carries only the
'contract' flag (never 'reassoc', 'nnan' or 'ninf'): the evaluation order is the one
written here, and inf/nan handling survives. Accuracy: at most 1 ulp over all 2**32
float32 inputs (tests/test_llvm_backend.py samples every 97th bit pattern in CI, all of
them with HYBRIDNET_MATHLIB_EXHAUSTIVE=1).
"""

from llvmlite import ir

from . import mathlib_coeffs as C

F32 = ir.FloatType()
I32 = ir.IntType(32)
_FLAGS = ("contract",)
NAMES = ("exp", "log", "tanh", "sigmoid", "erf")


class _Ops:
    """Float32 arithmetic on a builder with the flags above."""

    def __init__(self, b):
        self.b = b

    @staticmethod
    def k(value):
        return ir.Constant(F32, float(C._f(value)))

    def add(self, x, y):
        return self.b.fadd(x, y, flags=_FLAGS)

    def sub(self, x, y):
        return self.b.fsub(x, y, flags=_FLAGS)

    def mul(self, x, y):
        return self.b.fmul(x, y, flags=_FLAGS)

    def div(self, x, y):
        return self.b.fdiv(x, y, flags=_FLAGS)

    def neg(self, x):
        return self.b.fneg(x, flags=_FLAGS)

    def call(self, name, *args):
        fnty = ir.FunctionType(F32, [F32] * len(args))
        return self.b.call(self.b.module.declare_intrinsic(name, [F32], fnty), args)

    def muladd(self, x, y, z):
        return self.call("llvm.fmuladd", x, y, z)

    def fabs(self, x):
        return self.call("llvm.fabs", x)

    def sel(self, op, x, y, a, c):
        """a if (x op y) else c (ordered comparison; 'une' for !=)."""
        cond = self.b.fcmp_unordered(op, x, y) if op == "!=" else self.b.fcmp_ordered(op, x, y)
        return self.b.select(cond, a, c)

    def keep_nan(self, x, res):
        return self.sel("!=", x, x, x, res)

    def horner(self, t, coefs):
        """c0 + t*(c1 + t*(... + t*c_n))."""
        acc = self.k(coefs[-1])
        for c in reversed(coefs[:-1]):
            acc = self.add(self.k(c), self.mul(t, acc))
        return acc


def _exp_reduced(o, x):
    k = o.call("llvm.rint", o.mul(x, o.k(C._LOG2E)))
    r = o.muladd(o.neg(k), o.k(C._LN2_HI), x)
    r = o.muladd(o.neg(k), o.k(C._LN2_LO), r)
    q = o.horner(r, C._EXP_Q)
    return o.add(o.k(1.0), o.add(r, o.mul(o.mul(r, r), q))), k


def _scale2(o, p, k):
    b = o.b
    ki = b.fptosi(k, I32)
    k1 = b.ashr(ki, I32(1))
    k2 = b.sub(ki, k1)
    s1 = b.bitcast(b.shl(b.add(k1, I32(127)), I32(23)), F32)
    s2 = b.bitcast(b.shl(b.add(k2, I32(127)), I32(23)), F32)
    return o.mul(o.mul(p, s1), s2)


def _scale_normal(o, p, k):
    b = o.b
    shifted = b.shl(b.fptosi(k, I32), I32(23))
    return b.bitcast(b.add(b.bitcast(p, I32), shifted), F32)


def _exp(o, x):
    xc = o.sel("<", x, o.k(C._EXP_HI), x, o.k(C._EXP_HI))
    xc = o.sel(">", xc, o.k(C._EXP_LO), xc, o.k(C._EXP_LO))
    p, k = _exp_reduced(o, xc)
    return o.keep_nan(x, _scale2(o, p, k))


def _log(o, x):
    b = o.b
    tiny = b.fcmp_ordered("<", x, o.k(C._FLT_MIN))
    xs = b.select(tiny, o.mul(x, o.k(C._TWO23)), x)
    bits = b.bitcast(xs, I32)
    ei = b.ashr(b.sub(bits, I32(0x3F3504F3)), I32(23))
    m = b.bitcast(b.sub(bits, b.shl(ei, I32(23))), F32)
    e = b.sitofp(ei, F32)
    e = b.select(tiny, o.sub(e, o.k(23.0)), e)
    f = o.sub(m, o.k(1.0))
    z = o.mul(f, f)
    p = o.horner(f, C._LOG_P)
    y = o.sub(o.add(o.mul(o.mul(f, z), p), o.mul(e, o.k(C._LN2_LO))), o.mul(o.k(0.5), z))
    res = o.add(o.add(f, y), o.mul(e, o.k(C._LN2_HI)))
    res = o.sel("==", x, o.k(0.0), o.k(-float("inf")), res)
    res = o.sel("<", x, o.k(0.0), o.k(float("nan")), res)
    res = o.sel("==", x, o.k(float("inf")), x, res)
    return o.keep_nan(x, res)


def _tanh(o, x):
    a = o.fabs(x)
    t = o.mul(x, x)
    p = o.horner(t, C._TANH_P)
    small = o.add(x, o.mul(x, o.mul(t, p)))
    small = o.sel("<", a, o.k(C._TANH_TINY), x, small)
    ac = o.sel("<", a, o.k(10.0), a, o.k(10.0))
    m, k = _exp_reduced(o, o.add(ac, ac))
    big = o.sub(o.k(1.0), o.div(o.k(2.0), o.add(_scale_normal(o, m, k), o.k(1.0))))
    big = o.sel("<", x, o.k(0.0), o.neg(big), big)
    res = o.sel("<=", a, o.k(C._TANH_SPLIT), small, big)
    return o.keep_nan(x, res)


def _sigmoid(o, x):
    e = _exp(o, o.neg(o.fabs(x)))
    num = o.sel("<", x, o.k(0.0), e, o.k(1.0))
    rd = o.div(o.k(1.0), o.add(o.k(1.0), e))
    q = o.mul(num, rd)
    rho = o.muladd(o.neg(q), e, o.sub(num, q))
    return o.keep_nan(x, o.add(q, o.mul(rho, rd)))


def _erf(o, x):
    a = o.fabs(x)
    t = o.mul(x, x)
    small = o.add(x, o.mul(x, o.horner(t, C._ERF_P)))
    ac = o.sel("<", a, o.k(C._ERF_CLAMP), a, o.k(C._ERF_CLAMP))
    u = o.sub(ac, o.k(C._ERF_MID))
    r = o.horner(u, C._ERF_R)
    m, k = _exp_reduced(o, o.neg(o.mul(ac, ac)))
    big = o.sub(o.k(1.0), o.mul(_scale_normal(o, m, k), r))
    big = o.sel("<", x, o.k(0.0), o.neg(big), big)
    res = o.sel("<=", a, o.k(C._ERF_SPLIT), small, big)
    return o.keep_nan(x, res)


_BODIES = {"exp": _exp, "log": _log, "tanh": _tanh, "sigmoid": _sigmoid, "erf": _erf}


def function(module, name) -> ir.Function:
    """The module's `hn.<name>.f32` (float32 -> float32), emitted at its first request."""
    symbol = f"hn.{name}.f32"
    if symbol in module.globals:
        return module.globals[symbol]
    fn = ir.Function(module, ir.FunctionType(F32, [F32]), symbol)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(_BODIES[name](_Ops(b), fn.args[0]))
    return fn
