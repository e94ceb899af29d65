"""Shared helpers for the benchmark scripts: timing, peers, table printing."""

import contextlib
import multiprocessing
import statistics
import time


def median_time(fn, repeat=7, number=None, min_seconds=0.05) -> float:
    """Median seconds per call over `repeat` runs of `number` calls (auto-calibrated)."""
    fn()
    if number is None:
        start = time.perf_counter()
        fn()
        once = max(time.perf_counter() - start, 1e-7)
        number = max(1, min(100_000, int(min_seconds / once)))
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def optional(name):
    """Import a peer framework if installed, else None."""
    try:
        return __import__(name)
    except Exception:  # noqa: BLE001  (any import failure means "not available")
        return None


def fmt_time(seconds) -> str:
    """Human units."""
    if seconds != seconds:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def print_table(title, rows, columns):
    """rows: list of dicts; columns: list of (key, header, formatter)."""
    print(f"\n{title}")
    widths = [max(len(h), *(len(f(r.get(k))) for r in rows)) for k, h, f in columns]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)))
    for r in rows:
        print("  ".join(f(r.get(k)).rjust(w) for (k, _, f), w in zip(columns, widths)))


def _spin(stop):
    while not stop.is_set():
        sum(range(10_000))


@contextlib.contextmanager
def busy_neighbour(n=1):
    """`n` other processes spinning (one core each) for the duration of the block."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        time.sleep(0.2)  # (let them start)
        yield
    finally:
        stop.set()
        for proc in procs:
            proc.join()
