"""`LRScheduler`, the base of hybridnet.optim.lr_scheduler (PyTorch's protocol and names).

A scheduler writes new numbers into `optimizer.param_groups[i]["lr"]` (and, for the
cyclic schedules, `momentum` or `betas`). Those are hyper-parameters the optimizers read
through `tracked.hyper`, so writing them does not change the optimizer's structure: a
traced training step reads the new value at its next call, with no recompile. Call
`scheduler.step()` outside the traced function (its Python arithmetic is not traced).
"""

import warnings

import numpy as np

from .optimizer import Optimizer

EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated "
    "where possible. Please use `scheduler.step()` to step the scheduler. During the "
    "deprecation, if epoch is different from None, the closed form is used instead of the "
    "new chainable form, where available.")


def _format_param(name, optimizer, param) -> list:
    """One value per parameter group: `param` itself if a list/tuple of the right length."""
    if isinstance(param, (list, tuple)):
        if len(param) != len(optimizer.param_groups):
            raise ValueError(f"{name} must have the same length as optimizer.param_groups. "
                             f"{name} has {len(param)} values, param_groups has "
                             f"{len(optimizer.param_groups)}.")
        return list(param)
    return [param] * len(optimizer.param_groups)


def _param_groups_val_list(optimizer, key) -> list:
    return [group[key] for group in optimizer.param_groups]


def _update_param_group_val(group, key, value) -> None:
    # A NumPy scalar (from a user's lambda, say) is stored as the Python number it equals:
    # a traced step takes a new Python number as a runtime input, another type retraces.
    if isinstance(value, np.generic) and value.ndim == 0:
        value = value.item()
    group[key] = value


def _optimizer_stepped(optimizer) -> bool:
    """Whether `optimizer.step()` has run (PyTorch wraps `step` to know; hybridnet leaves
    the optimizer alone, so that traced steps stay guarded by its version only, and looks
    at its state: a step leaves an entry for each parameter it updated)."""
    for state in optimizer.state.values():
        step = dict.get(state, "step")
        if step is None or float(step) != 0:
            return True
    return False


def _warn_get_lr_called_within_step(scheduler) -> None:
    if not scheduler._get_lr_called_within_step:
        warnings.warn("To get the last learning rate computed by the scheduler, please use "
                      "`get_last_lr()`.", UserWarning, stacklevel=3)


class _enable_get_lr_call:
    def __init__(self, scheduler):
        self.o = scheduler

    def __enter__(self):
        self.o._get_lr_called_within_step = True
        return self

    def __exit__(self, *exc):
        self.o._get_lr_called_within_step = False


class _initial_mode:
    def __init__(self, scheduler):
        self.o = scheduler

    def __enter__(self):
        self.o._is_initial = True

    def __exit__(self, *exc):
        self.o._is_initial = False


class LRScheduler:
    """Adjusts the learning rate of every parameter group once per `step()`.

    `last_epoch` counts the calls to `step()` (-1: a fresh start; the constructor makes
    the first call, so it is 0 afterwards). A fresh start records each group's `lr` as
    its `initial_lr`; resuming with `last_epoch >= 0` requires `initial_lr` in the groups.
    Subclasses implement `get_lr()` (chainable, from the current `lr`) and optionally
    `_get_closed_form_lr()` (used by the deprecated `step(epoch)`).
    """

    _get_lr_called_within_step = False
    _is_initial = False

    def __init__(self, optimizer, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                                   "when resuming scheduler with last_epoch >= 0.")
        self.base_lrs = _param_groups_val_list(optimizer, "initial_lr")
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        """The constructor's call of `step()`."""
        self._step_count = 0
        with _initial_mode(self):
            self.step()

    def state_dict(self) -> dict:
        """Every attribute except the optimizer."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the attributes saved by `state_dict()`."""
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list:
        """The learning rates the last `step()` set, one per parameter group."""
        return self._last_lr

    def get_lr(self) -> list:
        """The learning rates for the current `last_epoch` (called by `step()`)."""
        raise NotImplementedError

    def step(self, epoch=None) -> None:
        """Advance one epoch (or, deprecated, jump to `epoch`) and set each group's lr."""
        if self._step_count == 1 and not _optimizer_stepped(self.optimizer):
            warnings.warn(
                "Detected call of `lr_scheduler.step()` before `optimizer.step()`. In PyTorch "
                "1.1.0 and later, you should call them in the opposite order: "
                "`optimizer.step()` before `lr_scheduler.step()`.  Failure to do this will "
                "result in PyTorch skipping the first value of the learning rate schedule.",
                UserWarning, stacklevel=2)
        self._step_count += 1
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None) -> None:
        with _enable_get_lr_call(self):
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                if hasattr(self, "_get_closed_form_lr"):
                    values = self._get_closed_form_lr()
                else:
                    values = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            _update_param_group_val(group, "lr", lr)
        self._last_lr = _param_groups_val_list(self.optimizer, "lr")
