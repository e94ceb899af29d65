"""RMSprop, as torch.optim.RMSprop defines it (optional momentum and centering)."""

import numpy as np

from ..functional import sqrt
from ..tensor import wrap
from .optimizer import Optimizer, _get
from .tracked import hyper


def _check(name, value, low=0.0):
    if not value >= low:
        raise ValueError(f"Invalid {name} value: {value}")


def _no_differentiable(cls, differentiable):
    if differentiable:
        raise NotImplementedError(f"{cls}: differentiable=True is not supported (the update "
                                  "runs under no_grad)")


class RMSprop(Optimizer):
    """Divide the gradient by a running root mean square of recent gradients.

    `centered` subtracts the running mean of the gradient (an estimate of its variance);
    `momentum` > 0 keeps a buffer of the scaled steps. `capturable` and `foreach` are
    accepted and stored for PyTorch compatibility (one implementation serves all).
    """

    hyper_keys = ("lr", "alpha", "eps", "weight_decay", "momentum")

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        for name, value in (("learning rate", lr), ("epsilon", eps), ("momentum", momentum),
                            ("weight_decay", weight_decay), ("alpha", alpha)):
            _check(name, value)
        _no_differentiable("RMSprop", differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps,
                                      centered=centered, weight_decay=weight_decay,
                                      capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _update(self, p, grad, state, group):
        momentum = hyper(group, "momentum")
        if not state:
            state["step"] = wrap(np.zeros((), np.float32))
            state["square_avg"] = wrap(np.zeros_like(p._data))
            if _get(group, "momentum") > 0:
                state["momentum_buffer"] = wrap(np.zeros_like(p._data))
            if _get(group, "centered"):
                state["grad_avg"] = wrap(np.zeros_like(p._data))
        g = -grad if _get(group, "maximize") else grad
        state["step"].add_(1)
        weight_decay = hyper(group, "weight_decay")
        if weight_decay:
            g = g + p * weight_decay
        alpha = hyper(group, "alpha")
        square_avg = state["square_avg"]
        square_avg.mul_(alpha).add_(g * g, alpha=1 - alpha)
        if _get(group, "centered"):
            grad_avg = state["grad_avg"]
            grad_avg.add_(g - grad_avg, alpha=1 - alpha)  # lerp_(g, 1 - alpha)
            avg = sqrt(square_avg - grad_avg * grad_avg)
        else:
            avg = sqrt(square_avg)
        avg = avg + hyper(group, "eps")
        lr = hyper(group, "lr")
        if momentum > 0:
            buf = state.get("momentum_buffer")
            if buf is None:  # momentum switched on after the first step (PyTorch: KeyError)
                buf = state["momentum_buffer"] = wrap(np.zeros_like(p._data))
            buf.mul_(momentum).add_(g / avg)
            p.add_(buf, alpha=-lr)
        else:
            p.add_(g / avg, alpha=-lr)
