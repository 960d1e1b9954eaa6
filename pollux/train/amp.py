"""Mixed precision's part in a step: the loss scale, and updates that AMP skips.

With a `torch.amp.GradScaler` the loss is scaled before the backward pass, so the gradients
the statistics see are scaled too (they are divided by the loss scale of the step), and a step
whose gradients overflow is skipped by the scaler: it makes no progress and must not be
counted. Without one (or with a disabled one) all of this is the identity.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import Optimizer

from pollux.train.gns import GradStats
from pollux.train.scaling import ScaledOptimizer


class MixedPrecision:
    """The optional AMP `GradScaler` of a training loop.

    Args:
        scaler: The scaler, or None without mixed precision.
    """

    def __init__(self, scaler: torch.amp.GradScaler | None) -> None:
        self.scaler = scaler
        self.loss_scale = 1.0
        """The loss scale of the current step (kept from the previous step's update)."""
        self._known = False

    @property
    def enabled(self) -> bool:
        """Whether a scaler is present and enabled."""
        return self.scaler is not None and self.scaler.is_enabled()

    def begin_step(self) -> None:
        """Read the loss scale before the first step (later steps keep the updated one)."""
        if self._known:
            return
        scaler = self.scaler
        enabled = scaler is not None and scaler.is_enabled()
        self.loss_scale = float(scaler.get_scale()) if scaler is not None and enabled else 1.0
        self._known = True

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to back-propagate."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def step(
        self,
        scaling: ScaledOptimizer,
        optimizer: Optimizer,
        *,
        scale: float,
        stats: tuple[GradStats, ...],
        lr_scale: float | None,
    ) -> bool:
        """Apply the optimizer with the scaled learning rate; False if AMP skipped the update.

        Progress is counted only for an update that was applied.
        """
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            scaling.step(scale, stats, lr_scale=lr_scale)
            return True
        scaling.step(
            scale,
            stats,
            lr_scale=lr_scale,
            step_fn=lambda: scaler.step(optimizer),
            count_progress=False,
        )
        scaler.update()
        before, self.loss_scale = self.loss_scale, float(scaler.get_scale())  # one sync
        if self.loss_scale < before:
            # The scaler backed off: it found inf/NaN gradients and skipped the update.
            return False
        scaling.count_progress()
        return True

    def state_dict(self) -> dict[str, Any] | None:
        """The scaler's state, or None without one."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore `state_dict` output (nothing when either side has no scaler)."""
        if self.scaler is not None and state is not None:
            self.scaler.load_state_dict(state)
