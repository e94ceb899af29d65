"""The tracing JIT: hn.trace, hn.explain, hn.benchmark."""

from .traced import TracedFunction, trace
