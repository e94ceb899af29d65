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


def flat_outputs(out) -> list:
    """The tensors of a (nested) tuple or list of results, in order."""
    if isinstance(out, (tuple, list)):
        return [y for x in out for y in flat_outputs(x)]
    return [out]


def weighted_call(f, params, args, grad):
    """(outputs, their values, `params`' gradients) of `f(*args)`; with `grad`, after
    backward() from the sum of each output squared times its position + 1 (grads zeroed
    first), else under no_grad."""
    for p in params:
        p.grad = None
    if grad:
        outs = flat_outputs(f(*args))
        sum((o * o).sum() * float(i + 1) for i, o in enumerate(outs)).backward()
    else:
        with hn.no_grad():
            outs = flat_outputs(f(*args))
    grads = [None if p.grad is None else p.grad.numpy().copy() for p in params]
    return outs, [o.detach().numpy().copy() for o in outs], grads


def recorded(fn, *args):
    """The trace graph of one call of `fn` traced (recorded and lowered)."""
    traced = hn.trace(fn)
    traced(*args)
    entry = next(iter(traced.specializations.values()))
    return entry.traces[0].tg


def source_arrays(tg, flat):
    """The arrays of `tg`'s graph inputs for a call on the flat arguments `flat`."""
    out = []
    for s in tg.sources:
        t = flat[s.index] if s.kind == "arg" else s.ref()
        out.append(t.detach().numpy())
    return out
