"""`hn.benchmark(fn, *args)`: eager vs traced timing on the same inputs."""

import statistics
import time

from .traced import TracedFunction, trace


class BenchmarkResult:
    """Medians of repeated runs, compile time, speedup and the break-even call count."""

    def __init__(self, name, eager, compiled, compile_seconds, repeat, number):
        self.name = name
        self.eager_seconds = eager
        self.compiled_seconds = compiled
        self.compile_seconds = compile_seconds
        self.repeat, self.number = repeat, number

    @property
    def speedup(self) -> float:
        """eager time / compiled time, per call."""
        return self.eager_seconds / self.compiled_seconds if self.compiled_seconds else float("inf")

    @property
    def break_even_calls(self) -> float:
        """Calls after which compiling has paid for itself (inf if it never does)."""
        saved = self.eager_seconds - self.compiled_seconds
        return self.compile_seconds / saved if saved > 0 else float("inf")

    def to_dict(self) -> dict:
        """Plain data."""
        return {"name": self.name, "eager_s": self.eager_seconds,
                "compiled_s": self.compiled_seconds, "compile_s": self.compile_seconds,
                "speedup": self.speedup, "break_even_calls": self.break_even_calls}

    def __str__(self) -> str:
        be = self.break_even_calls
        be_text = "never" if be == float("inf") else f"{be:,.0f} calls"
        return (f"{self.name}: eager {_fmt(self.eager_seconds)}, compiled "
                f"{_fmt(self.compiled_seconds)} per call (median of {self.repeat}); speedup "
                f"{self.speedup:.2f}x; compile {self.compile_seconds:.3f}s; break-even "
                f"{be_text}")

    __repr__ = __str__


def _fmt(seconds) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"


def _median_per_call(fn, args, kwargs, repeat, number) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn(*args, **kwargs)
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def _calibrate(fn, args, kwargs) -> int:
    start = time.perf_counter()
    fn(*args, **kwargs)
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(1000, int(0.02 / once)))


def benchmark(fn, *args, repeat: int = 7, number=None, **kwargs) -> BenchmarkResult:
    """Time `fn` eagerly and traced (medians of `repeat` runs) on the same inputs."""
    traced = fn if isinstance(fn, TracedFunction) else trace(fn)
    eager_fn = traced.fn
    start = time.perf_counter()
    traced(*args, **kwargs)  # trace + compile
    traced(*args, **kwargs)  # first compiled call (Numba compiles lazily)
    compile_seconds = time.perf_counter() - start
    number = number or _calibrate(eager_fn, args, kwargs)
    eager = _median_per_call(eager_fn, args, kwargs, repeat, number)
    compiled = _median_per_call(traced, args, kwargs, repeat, number)
    name = getattr(eager_fn, "__name__", type(eager_fn).__name__)
    return BenchmarkResult(name, eager, compiled, compile_seconds, repeat, number)
