"""Adadelta, as torch.optim.Adadelta defines it."""

import numpy as np

from ..functional import sqrt
from ..tensor import wrap
from .optimizer import Optimizer, _get
from .rmsprop import _check, _no_differentiable
from .tracked import hyper


class Adadelta(Optimizer):
    """Steps scaled by the ratio of running RMS of past updates to running RMS of gradients.

    `lr` (default 1.0) scales the step after that ratio. `foreach` and `capturable` are
    accepted and stored for PyTorch compatibility.
    """

    hyper_keys = ("lr", "rho", "eps", "weight_decay")

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        _check("learning rate", lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        _check("epsilon", eps)
        _check("weight_decay", weight_decay)
        _no_differentiable("Adadelta", differentiable)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize, capturable=capturable,
                                      foreach=foreach, differentiable=differentiable))

    def _update(self, p, grad, state, group):
        if not state:
            state["step"] = wrap(np.zeros((), np.float32))
            state["square_avg"] = wrap(np.zeros_like(p._data))
            state["acc_delta"] = wrap(np.zeros_like(p._data))
        state["step"].add_(1)
        g = -grad if _get(group, "maximize") else grad
        weight_decay = hyper(group, "weight_decay")
        if weight_decay:
            g = g + p * weight_decay
        rho, eps = hyper(group, "rho"), hyper(group, "eps")
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        square_avg.mul_(rho).add_(g * g, alpha=1 - rho)
        std = sqrt(square_avg + eps)
        delta = sqrt(acc_delta + eps) / std * g
        acc_delta.mul_(rho).add_(delta * delta, alpha=1 - rho)
        p.add_(delta, alpha=-hyper(group, "lr"))
