"""Live counters and the event log of a traced function."""

from dataclasses import asdict, dataclass, field


@dataclass
class Stats:
    """What a traced function did so far (`traced.stats`)."""

    calls: int = 0
    compiled_calls: int = 0
    eager_calls: int = 0
    hits: int = 0
    slow_lookups: int = 0  # calls no generated guard accepted (flatten + key)
    misses: int = 0
    side_exits: int = 0
    probes: int = 0  # calls of a new length traced to confirm kernels for every length
    traces: int = 0
    compiles: int = 0
    kernel_reuses: int = 0
    fallbacks: int = 0
    compiled_backwards: int = 0  # backward passes through a compiled call's kernel
    trace_seconds: float = 0.0
    compile_seconds: float = 0.0
    events: list = field(default_factory=list)

    def event(self, kind: str, detail: str, **extra) -> None:
        """Log a recompile, fallback, side exit... with its reason (kept bounded)."""
        entry = {"call": self.calls, "kind": kind, "detail": detail, **extra}
        self.events.append(entry)
        if len(self.events) > 200:
            del self.events[:100]

    def to_dict(self) -> dict:
        """Plain data."""
        return asdict(self)

    def __str__(self) -> str:
        return (f"calls={self.calls} compiled={self.compiled_calls} eager={self.eager_calls} "
                f"hits={self.hits} misses={self.misses} side_exits={self.side_exits} "
                f"probes={self.probes} "
                f"compiles={self.compiles} reuses={self.kernel_reuses} "
                f"fallbacks={self.fallbacks} compile_s={self.compile_seconds:.3f}")
