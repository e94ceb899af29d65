"""Small helpers the JIT regression tests share."""

import hybridnet as hn


def values(t):
    """A NumPy copy of a tensor's values (None stays None)."""
    return None if t is None else t.detach().numpy().copy()


def run_twice_then(traced, x, change):
    """Trace and compile on `x`, apply `change`, return the next traced result."""
    with hn.no_grad():
        traced(x)
        traced(x)
        change()
        return values(traced(x))
