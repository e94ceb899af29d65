"""Branch-free float32 transcendental functions for generated (numba) loops.

A call to libm inside a jitted loop blocks LLVM's loop vectorizer (one scalar call per
element: 5-30x slower here, see benchmarks/mathlib_speed.py). The functions below are
plain arithmetic -- range reduction, a polynomial, exponent-field bit manipulation and
selects -- so a loop such as

    for i in range(n):
        out[i] = exp_f32(x[i])

vectorizes (to <8 x float> / <16 x float> on AVX2 / AVX-512). Every function takes and
returns a float32 scalar and computes in float32. Accuracy over the whole float32 range is
within 2 ulp of the correctly rounded result -- 1 ulp measured over all 2**32 inputs
(`HYBRIDNET_MATHLIB_EXHAUSTIVE=1 pytest tests/test_mathlib.py -k exhaustive`); inf, nan
and signed-zero cases are exact.

Fast-math robustness: `inline='always'` inlines the body at numba-IR level, so it is
compiled with the *caller's* fast-math flags (the runtime engine uses reassoc and
contract). The steps whose exactness or evaluation order matters are therefore emitted by the
intrinsics below, which reassociation cannot see through: rounding to an integer
(llvm.rint), the Cody-Waite reduction (llvm.fmuladd), the final additions (fadd with an
explicit 'contract' flag -- numba's fast-math pass only adds flags to float instructions
that have none) and the two-step 2**k scaling. Callers must not use 'nnan'/'ninf'
(fastmath=True), which would delete the inf/nan handling. Results were verified on a host
with FMA (llvm.fmuladd fuses there; without FMA it is a multiply and an add, for which the
reductions are designed too, but that configuration is untested).

Coefficients are near-minimax fits made with numpy in float64 by Lawson's iteratively
reweighted least squares, then rounded to float32; `python -m compiler.lowering.mathlib_coeffs`
re-derives and prints them (see `derive_coefficients`).
"""

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .mathlib_coeffs import (  # noqa: F401  (derive_coefficients: re-exported)
    _ERF_CLAMP,
    _ERF_MID,
    _ERF_P,
    _ERF_R,
    _ERF_SPLIT,
    _EXP_HI,
    _EXP_LO,
    _EXP_Q,
    _FLT_MIN,
    _HALF,
    _INF,
    _LN2_HI,
    _LN2_LO,
    _LOG2E,
    _LOG_P,
    _NAN,
    _ONE,
    _TANH_P,
    _TANH_SPLIT,
    _TANH_TINY,
    _TWO,
    _TWO23,
    _ZERO,
    _f,
    derive_coefficients,
)

__all__ = ["exp_f32", "log_f32", "tanh_f32", "sigmoid_f32", "erf_f32", "LOWERING"]

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
# Explicit flag on the exactness-critical instructions: numba's fast-math pass only adds
# flags to float instructions without any, and 'contract' alone never changes a result by
# more than the rounding it removes.
_KEEP = ("contract",)

# ---------------------------------------------------------------- LLVM-level helpers


def _f32_only(*args):
    return all(a == types.float32 for a in args)


def _call_intrinsic(builder, name, args):
    fnty = ir.FunctionType(_F32, [_F32] * len(args))
    fn = builder.module.declare_intrinsic(name, [_F32], fnty)
    return builder.call(fn, args)


@intrinsic
def _rint(typingctx, x):
    """Round to nearest integer (ties to even) as float32: llvm.rint -> vroundps."""
    if not _f32_only(x):
        return None

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "llvm.rint", args)

    return types.float32(types.float32), codegen


@intrinsic
def _muladd(typingctx, a, b, c):
    """a * b + c, fused (one rounding, vfmadd) where the target has FMA (llvm.fmuladd)."""
    if not _f32_only(a, b, c):
        return None

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "llvm.fmuladd", args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def _add(typingctx, a, b):
    """a + b that the caller's 'reassoc' cannot reorder (fixes the summation order)."""
    if not _f32_only(a, b):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1], flags=_KEEP)

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _div(typingctx, a, b):
    """a / b as a bare fdiv (no ZeroDivisionError check under error_model='python')."""
    if not _f32_only(a, b):
        return None

    def codegen(context, builder, sig, args):
        return builder.fdiv(args[0], args[1])

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _scale2(typingctx, p, k):
    """p * 2**k for integral k in [-252, 254]: p * 2**(k>>1) * 2**(k - (k>>1)).

    Both factors are normal floats built in the exponent field, so p * 2**(k>>1) is exact
    for the p in [0.5, 2] used here and only the second product rounds (once, correctly,
    into the subnormal range or to inf).
    """
    if not _f32_only(p, k):
        return None

    def codegen(context, builder, sig, args):
        ki = builder.fptosi(args[1], _I32)
        k1 = builder.ashr(ki, _I32(1))
        k2 = builder.sub(ki, k1)
        s1 = builder.bitcast(builder.shl(builder.add(k1, _I32(127)), _I32(23)), _F32)
        s2 = builder.bitcast(builder.shl(builder.add(k2, _I32(127)), _I32(23)), _F32)
        return builder.fmul(builder.fmul(args[0], s1, flags=_KEEP), s2, flags=_KEEP)

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _scale_normal(typingctx, p, k):
    """p * 2**k by adding k to the exponent field; p * 2**k must be a normal float."""
    if not _f32_only(p, k):
        return None

    def codegen(context, builder, sig, args):
        shifted = builder.shl(builder.fptosi(args[1], _I32), _I32(23))
        return builder.bitcast(builder.add(builder.bitcast(args[0], _I32), shifted), _F32)

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _split_exponent(typingctx, x):
    """(e, m) with x == m * 2**e, m in [sqrt(1/2), sqrt(2)), for positive normal x.

    Integer arithmetic on the bit pattern: e = (bits - bits(sqrt(1/2))) >> 23 and
    m = bits - (e << 23). Other inputs give finite garbage (no poison), fixed up by the
    caller's selects.
    """
    if not _f32_only(x):
        return None
    retty = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        bits = builder.bitcast(args[0], _I32)
        e = builder.ashr(builder.sub(bits, _I32(0x3F3504F3)), _I32(23))
        m = builder.bitcast(builder.sub(bits, builder.shl(e, _I32(23))), _F32)
        return context.make_tuple(builder, retty, [builder.sitofp(e, _F32), m])

    return retty(types.float32), codegen


# ---------------------------------------------------------------- constants

# (in compiler.lowering.mathlib_coeffs, shared with the LLVM backend's IR versions)

# ---------------------------------------------------------------- functions


@njit(inline="always", fastmath=False)
def _exp_reduced(x):
    """(p, k) with e**x = p * 2**k, p in [0.7, 1.42], k integral, for finite |x| <= 104.

    k = rint(x / ln2), r = x - k*ln2 with a two-constant Cody-Waite reduction (|r| <= ln2/2,
    k * ln2_hi exact); e**r = 1 + r + r**2 * Q(r) with a degree-4 minimax Q.
    """
    k = _rint(x * _LOG2E)
    r = _muladd(-k, _LN2_HI, x)
    r = _muladd(-k, _LN2_LO, r)
    c = _EXP_Q
    q = c[0] + r * (c[1] + r * (c[2] + r * (c[3] + r * c[4])))
    return _add(_ONE, r + r * r * q), k


@njit(inline="always", fastmath=False)
def exp_f32(x):
    """e**x for a float32 x (float32 result).

    Method: clamp x to [-104, 89] (nan survives as 89 and is restored at the end);
    e**x = p * 2**k from `_exp_reduced` (Cody-Waite reduction, degree-4 minimax
    polynomial); p is scaled by 2**k in two exact steps (`_scale2`), which gives correctly
    rounded subnormals and inf above 88.7228.
    Accuracy: max 1 ulp (exhaustive). exp(-inf) = 0, exp(inf) = inf, exp(nan) = nan.
    """
    xc = x if x < _EXP_HI else _EXP_HI
    xc = xc if xc > _EXP_LO else _EXP_LO
    p, k = _exp_reduced(xc)
    res = _scale2(p, k)
    return x if x != x else res


@njit(inline="always", fastmath=False)
def log_f32(x):
    """Natural logarithm of a float32 x (float32 result).

    Method: subnormals are first scaled by 2**23; x = m * 2**e with m in
    [sqrt(1/2), sqrt(2)) by exponent-field arithmetic; f = m - 1 (exact);
    log(x) = e*ln2 + f - f**2/2 + f**3 * P(f) with a degree-7 minimax P, ln2 split in a
    9-bit high part and a low part.
    Accuracy: max 1 ulp (exhaustive). log(0) = -inf, log(x < 0) = nan, log(inf) = inf,
    log(nan) = nan.
    """
    tiny = x < _FLT_MIN
    xs = x * _TWO23 if tiny else x
    e, m = _split_exponent(xs)
    e = e - _f(23.0) if tiny else e
    f = m - _ONE
    z = f * f
    c = _LOG_P
    p = c[0] + f * (c[1] + f * (c[2] + f * (c[3] + f * (
        c[4] + f * (c[5] + f * (c[6] + f * c[7]))))))
    y = f * z * p + e * _LN2_LO - _HALF * z
    res = _add(_add(f, y), e * _LN2_HI)
    res = -_INF if x == _ZERO else res
    res = _NAN if x < _ZERO else res
    res = x if x == _INF else res
    return x if x != x else res


@njit(inline="always", fastmath=False)
def tanh_f32(x):
    """Hyperbolic tangent of a float32 x (float32 result).

    Method: |x| < 2**-12: x itself (correctly rounded, keeps -0.0); |x| <= 0.625:
    x + x**3 * P(x**2) with a degree-5 minimax P; otherwise 1 - 2 / (e**(2|x|) + 1) with
    exp's `_exp_reduced` and |x| clamped to 10 (tanh rounds to 1 beyond 9.01), then the
    sign of x.
    Accuracy: max 1 ulp (exhaustive). tanh(+-inf) = +-1, tanh(nan) = nan.
    """
    a = abs(x)
    t = x * x
    c = _TANH_P
    p = c[0] + t * (c[1] + t * (c[2] + t * (c[3] + t * (c[4] + t * c[5]))))
    small = _add(x, x * (t * p))
    small = x if a < _TANH_TINY else small  # keeps -0.0: (-0.0)**3 * P(0) is +0.0
    ac = a if a < _f(10.0) else _f(10.0)
    m, k = _exp_reduced(ac + ac)  # e**(2|x|) = m * 2**k is a normal float
    big = _ONE - _div(_TWO, _scale_normal(m, k) + _ONE)
    big = -big if x < _ZERO else big
    res = small if a <= _TANH_SPLIT else big
    return x if x != x else res


@njit(inline="always", fastmath=False)
def sigmoid_f32(x):
    """Logistic function 1 / (1 + e**-x) of a float32 x (float32 result).

    Method: e = exp_f32(-|x|) never overflows; x >= 0: 1 / (1 + e), x < 0: e / (1 + e),
    so large negative x give the correctly rounded tiny (down to subnormal) value e**x.
    Accuracy: max 1 ulp (exhaustive). sigmoid(inf) = 1, sigmoid(-inf) = 0, nan -> nan.
    """
    e = exp_f32(-abs(x))
    num = e if x < _ZERO else _ONE
    rd = _div(_ONE, _ONE + e)
    q = num * rd
    # One Newton correction with the residual num - q * (1 + e): num - q is exact
    # (Sterbenz) and the fused multiply-add rounds once, so neither the rounding of 1 + e
    # nor those of the reciprocal and the product reach the result.
    rho = _muladd(-q, e, num - q)
    res = _add(q, rho * rd)
    return x if x != x else res


@njit(inline="always", fastmath=False)
def erf_f32(x):
    """Error function of a float32 x (float32 result).

    Method: |x| <= 0.875: x + x * P(x**2) with a degree-6 minimax P (odd: erf(-0.0) = -0.0);
    otherwise 1 - e**(-x**2) * R(|x| - 2.4) with a degree-9 polynomial R fitted to
    erfcx = erfc * e**(x**2) on [0.875, 3.95] (absolute error weighted), |x| clamped to 4
    (erf rounds to 1 beyond 3.92), then the sign of x.
    Accuracy: max 1 ulp (exhaustive). erf(+-inf) = +-1, erf(nan) = nan.
    """
    a = abs(x)
    t = x * x
    c = _ERF_P
    p = c[0] + t * (c[1] + t * (c[2] + t * (c[3] + t * (c[4] + t * (c[5] + t * c[6])))))
    small = _add(x, x * p)
    ac = a if a < _ERF_CLAMP else _ERF_CLAMP
    u = ac - _ERF_MID
    c = _ERF_R
    r = c[8] + u * c[9]
    r = c[0] + u * (c[1] + u * (c[2] + u * (c[3] + u * (c[4] + u * (c[5] + u * (c[6] + u * (
        c[7] + u * r)))))))
    m, k = _exp_reduced(-(ac * ac))  # e**(-x**2) = m * 2**k >= e**-16 is a normal float
    big = _ONE - _scale_normal(m, k) * r
    big = -big if x < _ZERO else big
    res = small if a <= _ERF_SPLIT else big
    return x if x != x else res


# "<op>_f32" -> function: the table the JIT's lowering reads (hybridnet/jit/compile.py).
LOWERING = {"exp_f32": exp_f32, "log_f32": log_f32, "tanh_f32": tanh_f32,
            "sigmoid_f32": sigmoid_f32, "erf_f32": erf_f32}
