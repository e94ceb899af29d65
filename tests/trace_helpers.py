"""Small helpers the JIT regression tests share."""

import numpy as np

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


def same_loss_and_grads(traced, module, *args):
    """Call `traced` and its plain function on `args`, each followed by backward() from
    zeroed grads: the losses and `module`'s parameter gradients must match."""
    results = []
    for fn in (traced, traced.fn):
        module.zero_grad()
        loss = fn(*args)
        loss.backward()
        results.append((loss.item(), [p.grad.numpy().copy() for p in module.parameters()]))
    (got, got_grads), (want, want_grads) = results
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_grads, want_grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
