"""hybridnet.optim.lr_scheduler: PyTorch's learning-rate schedulers, same names and numbers.

Each scheduler writes `param_groups[i]["lr"]` (and, for the cyclic ones, `momentum` or
`betas`) with the same Python float arithmetic as torch.optim.lr_scheduler, so the
sequences agree exactly. A traced training step reads those settings as runtime inputs:
a schedule never recompiles it (call `scheduler.step()` outside the traced function).
"""

import math
import types
from bisect import bisect_right
from collections import Counter

from ._lr_base import (
    EPOCH_DEPRECATION_WARNING,
    LRScheduler,
    _param_groups_val_list,
    _update_param_group_val,
    _warn_get_lr_called_within_step,
)
from ._lr_cyclic import CosineAnnealingWarmRestarts, CyclicLR, OneCycleLR, ReduceLROnPlateau

__all__ = [
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
    "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler",
    "ReduceLROnPlateau", "CyclicLR", "CosineAnnealingWarmRestarts", "OneCycleLR",
    "PolynomialLR", "LRScheduler", "EPOCH_DEPRECATION_WARNING",
]


class _LRScheduler(LRScheduler):
    """PyTorch's old name of `LRScheduler` (older scripts subclass it)."""


def _lambdas(optimizer, lr_lambda) -> list:
    if not isinstance(lr_lambda, (list, tuple)):
        return [lr_lambda] * len(optimizer.param_groups)
    if len(lr_lambda) != len(optimizer.param_groups):
        raise ValueError(f"Expected {len(optimizer.param_groups)} lr_lambdas, but got "
                         f"{len(lr_lambda)}")
    return list(lr_lambda)


class _LambdaState:
    """state_dict/load_state_dict for schedulers holding `lr_lambdas`: plain functions are
    not saved, callable objects are saved by their `__dict__` (as PyTorch does)."""

    def state_dict(self) -> dict:
        """Every attribute except the optimizer; callable objects' attributes for lambdas."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the attributes (and callable objects' attributes) from `state_dict()`."""
        state_dict = dict(state_dict)
        saved = state_dict.pop("lr_lambdas")
        self.__dict__.update(state_dict)
        for fn, attrs in zip(self.lr_lambdas, saved):
            if attrs is not None:
                fn.__dict__.update(attrs)


class LambdaLR(_LambdaState, LRScheduler):
    """lr = initial_lr * lr_lambda(epoch) (one function, or one per parameter group)."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """initial_lr * lr_lambda(last_epoch) per group."""
        _warn_get_lr_called_within_step(self)
        return [base_lr * fn(self.last_epoch) for fn, base_lr in
                zip(self.lr_lambdas, self.base_lrs, strict=True)]


class MultiplicativeLR(_LambdaState, LRScheduler):
    """lr *= lr_lambda(epoch) at every step after the first."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda)
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"lr_lambda should be a function, but got {type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The current lr times lr_lambda(last_epoch) per group."""
        _warn_get_lr_called_within_step(self)
        if self._is_initial:
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * fn(self.last_epoch) for fn, group in
                zip(self.lr_lambdas, self.optimizer.param_groups, strict=True)]


class StepLR(LRScheduler):
    """lr *= gamma every `step_size` epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The current lr, times gamma at multiples of step_size."""
        _warn_get_lr_called_within_step(self)
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size)
                for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr *= gamma at each milestone epoch (a repeated milestone applies gamma again)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The current lr, times gamma ** count at a milestone."""
        _warn_get_lr_called_within_step(self)
        if self.last_epoch not in self.milestones:
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * self.gamma ** self.milestones[self.last_epoch]
                for group in self.optimizer.param_groups]

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the attributes saved by `state_dict()` (milestones as a Counter again,
        also after a trip through `hn.save`, which stores it as a plain dict)."""
        super().load_state_dict(state_dict)
        self.milestones = Counter(self.milestones)

    def _get_closed_form_lr(self) -> list:
        milestones = sorted(self.milestones.elements())
        return [base_lr * self.gamma ** bisect_right(milestones, self.last_epoch)
                for base_lr in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr = initial_lr * factor until epoch `total_iters`, then initial_lr."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if factor > 1.0 or factor < 0:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """factor at epoch 0, undone at total_iters."""
        _warn_get_lr_called_within_step(self)
        if self.last_epoch == 0:
            return [group["lr"] * self.factor for group in self.optimizer.param_groups]
        if self.last_epoch != self.total_iters:
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * (1.0 / self.factor) for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * (self.factor + (self.last_epoch >= self.total_iters)
                           * (1 - self.factor)) for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """lr goes linearly from initial_lr * start_factor to initial_lr * end_factor over
    `total_iters` epochs (a warm-up, typically)."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 "
                             "and less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The chainable linear step."""
        _warn_get_lr_called_within_step(self)
        if self.last_epoch == 0:
            return [group["lr"] * self.start_factor for group in self.optimizer.param_groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return _param_groups_val_list(self.optimizer, "lr")
        span = self.end_factor - self.start_factor
        return [group["lr"] * (1.0 + span / (self.total_iters * self.start_factor
                                             + (self.last_epoch - 1) * span))
                for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor)
                           * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr *= gamma every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The current lr times gamma."""
        _warn_get_lr_called_within_step(self)
        if self._is_initial:
            return _param_groups_val_list(self.optimizer, "lr")
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * self.gamma ** self.last_epoch for base_lr in self.base_lrs]


class PolynomialLR(LRScheduler):
    """lr = initial_lr * (1 - epoch / total_iters) ** power, constant after total_iters."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The chainable polynomial decay."""
        _warn_get_lr_called_within_step(self)
        if self._is_initial or self.last_epoch > self.total_iters:
            return _param_groups_val_list(self.optimizer, "lr")
        decay = ((1.0 - self.last_epoch / self.total_iters)
                 / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [group["lr"] * decay for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters)
                ** self.power for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from initial_lr to eta_min over T_max epochs, then back up
    (PyTorch's recursive form: it follows the other lr changes made meanwhile)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):  # noqa: N803
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        """The recursive cosine step."""
        _warn_get_lr_called_within_step(self)
        groups, t, T = self.optimizer.param_groups, self.last_epoch, self.T_max
        if self._is_initial:
            return _param_groups_val_list(self.optimizer, "lr")
        if self._step_count == 1 and t > 0:
            return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(t * math.pi / T)) / 2
                    for base_lr in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [group["lr"] + (base_lr - self.eta_min) * (1 - math.cos(math.pi / T)) / 2
                    for base_lr, group in zip(self.base_lrs, groups, strict=True)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (group["lr"] - self.eta_min) + self.eta_min for group in groups]

    def _get_closed_form_lr(self) -> list:
        return [self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


def _check_children(owner, optimizer, schedulers):
    name = type(owner).__name__
    for i, scheduler in enumerate(schedulers):
        if not hasattr(scheduler, "optimizer"):
            raise TypeError(f"{name} at index {i} should have `optimizer` as its attribute.")
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(f"{name} does not support `ReduceLROnPlateau` scheduler as it "
                             "requires additional kwargs to be specified when calling `step`, "
                             f"but got one at index {i} in the given schedulers sequence.")
        if optimizer is not scheduler.optimizer:
            raise ValueError(f"{name} expects all schedulers to belong to the same optimizer, "
                             f"but got scheduler {type(scheduler).__name__} at index {i} with "
                             "another optimizer.")


class _ChildrenState:
    """state_dict/load_state_dict that nest the child schedulers' own state dicts."""

    def state_dict(self) -> dict:
        """Every attribute except the optimizer; the children's state dicts."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the attributes and the children's state."""
        state_dict = dict(state_dict)
        children = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        for scheduler, state in zip(self._schedulers, children):
            scheduler.load_state_dict(state)


class SequentialLR(_ChildrenState, LRScheduler):
    """Runs `schedulers[i]` from `milestones[i - 1]` on (e.g. a LinearLR warm-up, then a
    cosine decay)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler, but got "
                             "no scheduler.")
        _check_children(self, optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to be "
                             "one more than the number of milestone points, but got number of "
                             f"schedulers {len(schedulers)} and the number of milestones to be "
                             f"equal to {len(milestones)}")
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # undo what the schedulers' constructors did
            _update_param_group_val(group, "lr", group["initial_lr"])
        self.recursive_undo()
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()

    def recursive_undo(self, sched=None) -> None:
        """Step back every (nested) scheduler's last_epoch by one."""
        scheds = self if sched is None else sched
        if hasattr(scheds, "_schedulers"):
            for s in scheds._schedulers:
                self.recursive_undo(s)
        elif hasattr(scheds, "last_epoch"):
            scheds.last_epoch -= 1

    def step(self) -> None:
        """Step the scheduler in charge of the new epoch (restarting it at a milestone)."""
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_ChildrenState, LRScheduler):
    """Steps every scheduler in `schedulers` at each `step()` (their effects compose)."""

    def __init__(self, schedulers, optimizer=None):
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler to be "
                             "chained, but got no scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        _check_children(self, optimizer, schedulers)
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = _param_groups_val_list(self._schedulers[-1].optimizer, "lr")

    def step(self) -> None:
        """Step every chained scheduler."""
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = _param_groups_val_list(self._schedulers[-1].optimizer, "lr")
