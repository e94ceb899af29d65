"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay."""

from .optimizer import Optimizer, _get
from .tracked import hyper


class SGD(Optimizer):
    """torch.optim.SGD's update rule, written with in-place tensor ops."""

    hyper_keys = ("lr", "momentum", "dampening", "weight_decay")

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: invalid lr={lr}, momentum={momentum} or "
                             f"weight_decay={weight_decay} (all must be >= 0)")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _update(self, p, grad, state, group):
        d_p = -grad if _get(group, "maximize") else grad
        weight_decay = hyper(group, "weight_decay")
        if weight_decay:
            d_p = d_p + p * weight_decay
        momentum = hyper(group, "momentum")
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = d_p.clone().detach()
            else:
                buf.mul_(momentum).add_(d_p, alpha=1 - hyper(group, "dampening"))
            d_p = d_p + buf * momentum if _get(group, "nesterov") else buf
        p.add_(d_p, alpha=-hyper(group, "lr"))
