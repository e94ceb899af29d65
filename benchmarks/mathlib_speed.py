"""float32 transcendentals in a jitted loop: compiler.lowering.mathlib vs libm vs NumPy.

    python benchmarks/mathlib_speed.py [--log2n 20] [--repeat 31]

For N = 2**log2n float32 elements, each figure is the median over `repeat` runs (microseconds) of
  mathlib - a numba loop calling <name>_f32, with the engine's fast-math flags
            (reassoc, contract, nsz; error_model='numpy'), as generated kernels do;
  libm    - the same loop calling np.exp / np.log / np.tanh / math.erf on each element
            (sigmoid: 1 / (1 + np.exp(-x))), i.e. one scalar libm call per element;
  numpy   - the ufunc (np.exp, np.log, np.tanh; scipy.special.expit / erf) into `out`.
Ratios are peer / mathlib (higher means mathlib is faster). The last column says whether
the mathlib loop's LLVM IR holds float vectors and no libm call.
"""

import argparse
import math
import re
import statistics
import time

import numpy as np
from numba import njit
from scipy import special

from compiler.lowering import mathlib

FASTMATH = {"reassoc", "contract", "nsz"}  # runtime.numba_engine.FASTMATH
_ONE = np.float32(1.0)


def _loop(scalar_fn):
    @njit(fastmath=FASTMATH, error_model="numpy")
    def run(x, out):
        for i in range(x.size):
            out[i] = scalar_fn(x[i])

    return run


@njit(inline="always")
def _libm_sigmoid(v):
    return _ONE / (_ONE + np.exp(-v))


@njit(inline="always")
def _libm_erf(v):
    return np.float32(math.erf(v))


LIBM = {"exp": njit(inline="always")(lambda v: np.exp(v)),
        "log": njit(inline="always")(lambda v: np.log(v)),
        "tanh": njit(inline="always")(lambda v: np.tanh(v)),
        "sigmoid": _libm_sigmoid, "erf": _libm_erf}
UFUNC = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": special.expit,
         "erf": special.erf}
RANGES = {"exp": (-80.0, 80.0), "log": (1e-3, 1e3), "tanh": (-6.0, 6.0),
          "sigmoid": (-20.0, 20.0), "erf": (-4.0, 4.0)}


def _median_ms(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _vectorized(run) -> str:
    llvm = run.inspect_llvm(run.signatures[0])
    widths = sorted({int(w) for w in re.findall(r"<(\d+) x float>", llvm)})
    libm = re.search(r"call [^@\n]*@(?!llvm\.)\w*(exp|log|tanh|erf)\w*\(", llvm)
    return f"<{max(widths)} x float>" + (", libm call!" if libm else "") if widths else "no"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=31)
    args = parser.parse_args()
    n = 1 << args.log2n
    rng = np.random.default_rng(0)
    print(f"N = 2**{args.log2n} float32, median of {args.repeat} runs, us (ratio = peer / mathlib)")
    print(f"{'function':9s} {'mathlib':>9s} {'libm':>9s} {'numpy':>9s} "
          f"{'libm/ml':>8s} {'numpy/ml':>9s}  vectorized")
    for name in ("exp", "log", "tanh", "sigmoid", "erf"):
        lo, hi = RANGES[name]
        x = rng.uniform(lo, hi, n).astype(np.float32)
        out = np.empty_like(x)
        fast, libm = _loop(getattr(mathlib, f"{name}_f32")), _loop(LIBM[name])
        ufunc = UFUNC[name]
        t_fast = _median_ms(lambda: fast(x, out), args.repeat)  # noqa: B023 (called now)
        t_libm = _median_ms(lambda: libm(x, out), args.repeat)  # noqa: B023
        t_np = _median_ms(lambda: ufunc(x, out=out), args.repeat)  # noqa: B023
        print(f"{name:9s} {t_fast:9.1f} {t_libm:9.1f} {t_np:9.1f} "
              f"{t_libm / t_fast:8.1f}x {t_np / t_fast:8.1f}x  {_vectorized(fast)}")


if __name__ == "__main__":
    main()
