"""Learning-rate scaling rules and progress accounting (reference §2).

When the total batch grows from M0 to M = S·M0, each rule gives a factor per param group:
`ADASCALE` r(S) = (var + sqr)/(var/S + sqr) (√r for Adam/AdamW), `LINEAR` S, `SQRT` √S, `NONE`
1. The factor multiplies each group's learning rate for one ``optimizer.step()`` and the user's
value is put back afterwards, so LR schedulers act on the base rate and never see the scaled
one. Whatever the rule, progress is counted in M0-steps: every applied step adds the AdaScale
gain r(S) of the summed statistics, so "how far along" does not depend on the batch sizes a job
happened to run with.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.optim import Optimizer

from pollux.train.errors import InvalidValueError
from pollux.train.gns import GradStats, is_adam


class ScalingRule(enum.StrEnum):
    """How the learning rate follows the batch scale S = M/M0 (proto `ScalingRule`)."""

    ADASCALE = "adascale"
    """AdaScale's gain from the gradient noise scale (square root of it for Adam/AdamW)."""
    LINEAR = "linear"
    """Goyal et al.'s linear scaling."""
    SQRT = "sqrt"
    """Square-root scaling (Krizhevsky; common for Adam)."""
    NONE = "none"
    """The learning rate is never changed."""

    @classmethod
    def parse(cls, value: object) -> ScalingRule:
        """Accept a rule or its name (case-insensitive).

        Raises:
            InvalidValueError: Unknown name; the message lists the valid ones.
        """
        if isinstance(value, ScalingRule):
            return value
        if not isinstance(value, str):
            # str(None) would be "none": silently no scaling instead of the default.
            names = ", ".join(r.value for r in cls)
            raise InvalidValueError("scaling_rule", f"must be a rule name ({names}), got {value!r}")
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            names = ", ".join(r.value for r in cls)
            raise InvalidValueError(
                "scaling_rule", f"unknown rule {value!r}; use one of {names}"
            ) from None


def lr_factor(rule: ScalingRule, scale: float, stats: GradStats, *, adam: bool = False) -> float:
    """The learning-rate multiplier of one param group at batch scale `scale`.

    Args:
        rule: The scaling rule.
        scale: S = M/M0, > 0.
        stats: The group's smoothed gradient statistics (used by `ScalingRule.ADASCALE` only).
        adam: Whether the optimizer is Adam-like: AdaScale's factor is then square-rooted,
            because Adam's update size is already normalised by the gradient's second moment.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise InvalidValueError("scale", f"must be finite and > 0, got {scale}")
    match rule:
        case ScalingRule.ADASCALE:
            factor = stats.gain(scale)
            return math.sqrt(factor) if adam else factor
        case ScalingRule.LINEAR:
            return scale
        case ScalingRule.SQRT:
            return math.sqrt(scale)
        case ScalingRule.NONE:
            return 1.0


class ScaledOptimizer:
    """Runs a torch optimizer's steps with scaled learning rates and counts progress.

    The wrapped optimizer is used as is (no monkey-patching); only `step` goes through here.

    Args:
        optimizer: Any `torch.optim.Optimizer` (SGD, Adam, AdamW, ...).
        rule: The scaling rule; `ScalingRule.ADASCALE` by default.
        adam: Treat the optimizer as Adam-like; default: detected from its type.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        rule: ScalingRule | str = ScalingRule.ADASCALE,
        *,
        adam: bool | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.rule = ScalingRule.parse(rule)
        self.adam = is_adam(optimizer) if adam is None else adam
        self.progress = 0.0
        """Training progress in steps of the initial batch M0 (Σ gain over applied steps)."""
        self.steps = 0
        """Optimizer steps applied."""
        self.last_factors: tuple[float, ...] = (1.0,) * len(optimizer.param_groups)
        """Learning-rate factors of the latest step, per param group."""
        self.last_gain = 1.0
        """Gain r(S) of the latest step."""

    def factors(
        self, scale: float, group_stats: Sequence[GradStats], lr_scale: float | None = None
    ) -> tuple[float, ...]:
        """Per-group learning-rate factors at batch scale `scale`.

        Args:
            scale: S = M/M0.
            group_stats: Smoothed statistics, one per param group.
            lr_scale: An explicit factor for every group that overrides the rule (e.g. chosen
                by the control plane); None to use the rule.
        """
        groups = len(self.optimizer.param_groups)
        if len(group_stats) != groups:
            raise InvalidValueError(
                "group_stats", f"expected {groups} entries (one per param group)"
            )
        if lr_scale is not None:
            if not (math.isfinite(lr_scale) and lr_scale > 0):
                raise InvalidValueError("lr_scale", f"must be finite and > 0, got {lr_scale}")
            return (lr_scale,) * groups
        return tuple(lr_factor(self.rule, scale, s, adam=self.adam) for s in group_stats)

    @contextmanager
    def scaled_lr(self, factors: Sequence[float]) -> Iterator[None]:
        """Multiply each group's ``lr`` by its factor inside the block; restore it on exit.

        The original value object is put back, even if the block raises, so a tensor learning
        rate stays the same tensor and schedulers see exactly what they set.
        """
        groups = self.optimizer.param_groups
        saved = [group["lr"] for group in groups]
        try:
            for group, base, factor in zip(groups, saved, factors, strict=True):
                group["lr"] = base * factor
            yield
        finally:
            for group, base in zip(groups, saved, strict=True):
                group["lr"] = base

    def step(
        self,
        scale: float,
        group_stats: Sequence[GradStats],
        *,
        lr_scale: float | None = None,
        step_fn: Callable[[], object] | None = None,
        count_progress: bool = True,
    ) -> float:
        """Take one optimizer step at batch scale `scale` and account its progress.

        Args:
            scale: S = M/M0 of the step's total batch.
            group_stats: Smoothed statistics per param group.
            lr_scale: Explicit factor overriding the rule (see `factors`).
            step_fn: What performs the step, e.g. ``lambda: scaler.step(optimizer)`` with AMP;
                default ``optimizer.step``.
            count_progress: False when the step is known not to have been applied (e.g. AMP
                skipped it after an overflow): then progress does not move.

        Returns:
            The gain r(S) added to `progress` (0 when not counted).
        """
        factors = self.factors(scale, group_stats, lr_scale)
        with self.scaled_lr(factors):
            if step_fn is None:
                self.optimizer.step()
            else:
                step_fn()
        self.last_factors = factors
        total = GradStats(sqr=sum(s.sqr for s in group_stats), var=sum(s.var for s in group_stats))
        self.last_gain = total.gain(scale)
        if not count_progress:
            return 0.0
        return self.count_progress()

    def count_progress(self) -> float:
        """Count the latest step as applied (after `step` with ``count_progress=False``)."""
        self.steps += 1
        self.progress += self.last_gain
        return self.last_gain

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state for checkpoints (the wrapped optimizer is saved separately)."""
        return {
            "rule": self.rule.value,
            "progress": self.progress,
            "steps": self.steps,
            "last_gain": self.last_gain,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore progress and step count. The rule stays the one given at construction."""
        self.progress = float(state["progress"])
        self.steps = int(state["steps"])
        self.last_gain = float(state.get("last_gain", 1.0))


def current_lrs(optimizer: Optimizer) -> list[float]:
    """Each param group's learning rate as a float (tensor rates are read out)."""
    out: list[float] = []
    for group in optimizer.param_groups:
        lr = group["lr"]
        out.append(float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr))
    return out
