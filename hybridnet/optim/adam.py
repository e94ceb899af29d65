"""Adam and AdamW (decoupled weight decay), as torch.optim defines them."""


import numpy as np

from ..dtypes import float64
from ..functional import maximum, sqrt
from ..tensor import wrap
from .optimizer import Optimizer, _get
from .tracked import hyper


class Adam(Optimizer):
    """Adam with bias correction; optional L2 weight_decay and amsgrad."""

    _decoupled = False
    hyper_keys = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, maximize=False):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"{type(self).__name__}: invalid lr={lr}, eps={eps} or "
                             f"betas={betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _init_state(self, p, state, amsgrad):
        # The step count is a tensor, as in PyTorch, so a traced step need not guard on it.
        state["step"] = wrap(np.zeros((), np.float32))
        state["exp_avg"] = wrap(np.zeros_like(p._data))
        state["exp_avg_sq"] = wrap(np.zeros_like(p._data))
        if amsgrad:
            state["max_exp_avg_sq"] = wrap(np.zeros_like(p._data))

    def _update(self, p, grad, state, group):
        if not state:
            self._init_state(p, state, _get(group, "amsgrad"))
        beta1, beta2 = hyper(group, "betas")
        lr, wd = hyper(group, "lr"), hyper(group, "weight_decay")
        g = -grad if _get(group, "maximize") else grad
        if wd and self._decoupled:
            p.mul_(1 - lr * wd)
        elif wd:
            g = g + p * wd
        # bias corrections in double precision, as PyTorch computes them from Python floats
        # (and as a traced step does from its float64 settings)
        step = state["step"].add_(1).to(float64)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).add_(g * g, alpha=1 - beta2)
        bias1 = 1 - beta1 ** step
        bias2 = 1 - beta2 ** step
        second = exp_avg_sq
        if _get(group, "amsgrad"):
            state["max_exp_avg_sq"].copy_(maximum(state["max_exp_avg_sq"], exp_avg_sq))
            second = state["max_exp_avg_sq"]
        denom = sqrt(second) / sqrt(bias2) + hyper(group, "eps")
        p.sub_(exp_avg / denom * (lr / bias1))


class AdamW(Adam):
    """Adam with decoupled weight decay (default weight_decay=0.01)."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, maximize=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)


