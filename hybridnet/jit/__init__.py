"""The tracing JIT: hn.trace, hn.explain, hn.benchmark."""

from .bench import BenchmarkResult, benchmark
from .explain import ExplainReport, explain
from .traced import TracedFunction, trace
