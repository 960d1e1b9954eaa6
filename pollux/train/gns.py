"""Gradient noise scale: the statistics behind statistical efficiency (reference §8.2).

From c ≥ 2 independent gradients of equal batch whose mean the optimizer applies (total batch
M = S·M0), with L = (1/c) Σ|g_i|² and T = |(1/c) Σ g_i|², the unbiased estimators are
sqr = (c·T − L)/(c − 1) of |G|² and var = (L − T)·S/(c − 1) of tr(Σ)/M0 (`estimate`). The c
gradients are the replicas' and the accumulation micro-batches' (c = K·s); with one of each the
differenced estimator pairs consecutive steps (c = 2, S doubled). `GradientNoiseScale` smooths
the estimates per param group (bias-corrected, θ = 0.999^S) and `GradientCollector` reads the
norms through gradient hooks, pre-conditioned for Adam/AdamW. Pure tensor maths: summing over
replicas is the caller's (docs/architecture.md, "The training library").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.optim import Optimizer
from torch.utils.hooks import RemovableHandle

from pollux.train.errors import InvalidValueError

DEFAULT_SMOOTHING = 0.999
"""Per-M0-step decay of the moving averages (published value)."""

VAR_FLOOR = 1e-6
"""Smallest variance a group reports: keeps the gain defined while sqr is still 0."""

ADAM_WARMUP_STEPS = 5
"""Adam steps before its second-moment estimate is trusted as a preconditioner (published)."""


@dataclass(frozen=True, slots=True)
class GradStats:
    """Smoothed gradient statistics, in the units of the goodput model (reference §1.2).

    Attributes:
        sqr: Estimate of |G|², the squared norm of the true (pre-conditioned) gradient; ≥ 0.
        var: Estimate of tr(Σ)/M0, the noise variance of a gradient on M0 samples; > 0.
    """

    sqr: float
    var: float

    def __post_init__(self) -> None:
        for name in ("sqr", "var"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidValueError(f"grad_stats.{name}", f"must be finite and ≥ 0: {value}")

    @property
    def noise_scale(self) -> float:
        """The noise scale var/sqr = φ/M0 per initial batch (∞ if sqr = 0)."""
        return math.inf if self.sqr == 0.0 else self.var / self.sqr

    def pgns(self, init_batch_size: int) -> float:
        """The pre-conditioned gradient noise scale φ = M0 · var / sqr, in samples."""
        return init_batch_size * self.noise_scale

    def gain(self, scale: float) -> float:
        """AdaScale gain r(S): how many M0-batch steps one step at S = M/M0 is worth."""
        return adascale_gain(self.sqr, self.var, scale)

    def efficiency(self, scale: float) -> float:
        """Statistical efficiency r(S)/S of a batch S times the initial one, in (0, 1] for S ≥ 1."""
        _check_scale(scale)
        return self.gain(scale) / scale


def adascale_gain(sqr: float, var: float, scale: float) -> float:
    """AdaScale gain r(S) = (var + sqr) / (var/S + sqr); 1 when the denominator is not > 0.

    Args:
        sqr: |G|² estimate (≥ 0).
        var: tr(Σ)/M0 estimate (≥ 0).
        scale: S = M / M0 (> 0).
    """
    _check_scale(scale)
    denominator = var / scale + sqr
    if not denominator > 0.0:
        return 1.0
    return (var + sqr) / denominator


def estimate(local_sqr: float, total_sqr: float, count: int, scale: float) -> tuple[float, float]:
    """Unbiased one-step estimates of (|G|², tr(Σ)/M0) from c gradients (module docstring).

    Args:
        local_sqr: L, the mean squared norm of the c individual gradients.
        total_sqr: T, the squared norm of their mean.
        count: c ≥ 2, the number of independent equal-size gradients.
        scale: S = M / M0 of the mean gradient (M = c × the size of one gradient's batch).

    Returns:
        (sqr, var), unclamped: a single step's estimate can be negative.
    """
    if count < 2:
        raise InvalidValueError("count", f"needs at least 2 gradients, got {count}")
    _check_scale(scale)
    sqr = (count * total_sqr - local_sqr) / (count - 1)
    var = (local_sqr - total_sqr) * scale / (count - 1)
    return sqr, var


def _check_scale(scale: float) -> None:
    if not (math.isfinite(scale) and scale > 0.0):
        raise InvalidValueError("scale", f"the batch scale M/M0 must be finite and > 0: {scale}")


class GradientNoiseScale:
    """Bias-corrected moving averages of the per-group estimates (reference §8.2).

    Call `update` once per optimizer step with the step's L and T per parameter group. Before
    the first update the averages are the published neutral values (sqr = 1, var = 0), whose
    gain is 1 at every scale, so an unmeasured job trains as if its batch were M0.

    Args:
        num_groups: Number of optimizer parameter groups (≥ 1).
        smoothing: Per-M0-step decay θ₀ of the averages, in (0, 1); θ = θ₀^S per step.
    """

    def __init__(self, num_groups: int, *, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if num_groups < 1:
            raise InvalidValueError("num_groups", f"must be ≥ 1, got {num_groups}")
        if not 0.0 < smoothing < 1.0:
            raise InvalidValueError("smoothing", f"must be in (0, 1), got {smoothing}")
        self._groups = num_groups
        self._smoothing = smoothing
        self._reset()
        self.updates = 0
        """Number of accepted updates."""
        self.skipped = 0
        """Number of steps rejected because a statistic was not finite (e.g. AMP overflow)."""

    def _reset(self) -> None:
        self._cache: tuple[tuple[GradStats, ...], GradStats] | None = None
        self._sqr_biased = [0.0] * self._groups
        self._var_biased = [0.0] * self._groups
        self._unbias = 0.0
        self._differenced = False
        self._measured = False

    @property
    def num_groups(self) -> int:
        """Number of parameter groups tracked."""
        return self._groups

    @property
    def measured(self) -> bool:
        """Whether any estimate has been accepted since the start or the last reset."""
        return self._measured

    def update(
        self,
        local_sqr: Sequence[float],
        total_sqr: Sequence[float],
        count: int,
        scale: float,
        *,
        differenced: bool = False,
        steps: float = 1.0,
    ) -> bool:
        """Fold one optimizer step's statistics into the averages.

        Args:
            local_sqr: L per parameter group (see `estimate`).
            total_sqr: T per parameter group.
            count: Number of gradients c behind L and T (2 for the differenced estimator).
            scale: S = M/M0 of the mean gradient (for the differenced estimator: twice the
                step's own scale, since two steps' gradients are averaged).
            differenced: Whether L and T come from the differenced estimator. Returning from it
                to true per-replica/micro-batch gradients discards its averages, which are
                biased by the parameter change between steps (published behaviour).
            steps: Optimizer steps this measurement stands for, when statistics are measured
                only every few steps: the decay is θ₀^(S·steps), so the averages forget at the
                same rate per step as when every step is measured.

        Returns:
            True if the step was used; False if any statistic was not finite (the step is
            skipped and counted in `skipped`, never folded in).
        """
        if len(local_sqr) != self._groups or len(total_sqr) != self._groups:
            raise InvalidValueError(
                "local_sqr",
                f"expected {self._groups} values (one per param group), got "
                f"{len(local_sqr)} and {len(total_sqr)}",
            )
        _check_scale(scale)
        if not (math.isfinite(steps) and steps > 0):
            raise InvalidValueError("steps", f"must be finite and > 0, got {steps}")
        values = [*local_sqr, *total_sqr]
        if not all(math.isfinite(v) for v in values):
            self.skipped += 1
            return False
        if self._differenced and not differenced:
            self._reset()
        self._differenced = differenced
        estimates = [
            estimate(lo, to, count, scale) for lo, to in zip(local_sqr, total_sqr, strict=True)
        ]
        if not all(math.isfinite(s) and math.isfinite(v) for s, v in estimates):
            self.skipped += 1
            return False
        theta = self._smoothing ** (scale * steps)
        for g, (sqr, var) in enumerate(estimates):
            self._sqr_biased[g] = theta * self._sqr_biased[g] + (1.0 - theta) * sqr
            self._var_biased[g] = theta * self._var_biased[g] + (1.0 - theta) * var
        self._unbias = theta * self._unbias + (1.0 - theta)
        self._measured = True
        self._cache = None
        self.updates += 1
        return True

    def group_stats(self) -> tuple[GradStats, ...]:
        """Per-group averages, sqr clamped ≥ 0 and var ≥ `VAR_FLOOR` (AdaScale uses these)."""
        if self._cache is None:
            if not self._measured:
                groups = tuple(GradStats(sqr=1.0, var=VAR_FLOOR) for _ in range(self._groups))
            else:
                groups = tuple(
                    GradStats(
                        sqr=max(s / self._unbias, 0.0),
                        var=max(v / self._unbias, VAR_FLOOR),
                    )
                    for s, v in zip(self._sqr_biased, self._var_biased, strict=True)
                )
            total = GradStats(sqr=sum(g.sqr for g in groups), var=sum(g.var for g in groups))
            self._cache = (groups, total)
        return self._cache[0]

    @property
    def stats(self) -> GradStats:
        """Statistics summed over parameter groups: what the goodput model consumes."""
        self.group_stats()
        assert self._cache is not None
        return self._cache[1]

    def gain(self, scale: float) -> float:
        """AdaScale gain r(S) of the summed statistics (progress per step, in M0-steps)."""
        return self.stats.gain(scale)

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state for checkpoints."""
        return {
            "sqr_biased": list(self._sqr_biased),
            "var_biased": list(self._var_biased),
            "unbias": self._unbias,
            "differenced": self._differenced,
            "measured": self._measured,
            "updates": self.updates,
            "skipped": self.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output; the number of groups must match."""
        if len(state["sqr_biased"]) != self._groups:
            raise InvalidValueError(
                "gns.state",
                f"checkpoint has {len(state['sqr_biased'])} param groups, the optimizer "
                f"{self._groups}; restore with the optimizer the checkpoint was made with",
            )
        self._sqr_biased = [float(x) for x in state["sqr_biased"]]
        self._var_biased = [float(x) for x in state["var_biased"]]
        self._unbias = float(state["unbias"])
        self._differenced = bool(state["differenced"])
        self._measured = bool(state["measured"])
        self.updates = int(state["updates"])
        self.skipped = int(state["skipped"])
        self._cache = None


class Preconditioner(Protocol):
    """Maps a parameter to the elementwise divisor of its gradient, or None for identity."""

    def __call__(self, param: torch.Tensor, group: int) -> torch.Tensor | None:
        """The divisor for `param` (in param group `group`) under the current optimizer state."""
        ...


class AdamPreconditioner:
    """sqrt(v / (1 − β2^t)) + eps from Adam's state, identity for the first few steps.

    Args:
        optimizer: A `torch.optim.Adam` or `AdamW` (anything with ``exp_avg_sq``, ``step``,
            ``betas`` and ``eps`` in the same places).
        warmup_steps: Adam steps before v̂ is trusted; identity before that.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int = ADAM_WARMUP_STEPS) -> None:
        self._optimizer = optimizer
        self._warmup = warmup_steps

    def __call__(self, param: torch.Tensor, group: int) -> torch.Tensor | None:
        """Adam's current denominator for `param` (None while Adam is warming up)."""
        state = self._optimizer.state.get(param)
        if not state or "exp_avg_sq" not in state:
            return None
        step = float(state["step"])
        if step < self._warmup:
            return None
        options = self._optimizer.param_groups[group]
        beta2 = float(options["betas"][1])
        eps = float(options["eps"])
        exp_avg_sq: torch.Tensor = state["exp_avg_sq"]
        divisor: torch.Tensor = (exp_avg_sq / (1.0 - beta2**step)).sqrt_().add_(eps)
        return divisor


def is_adam(optimizer: Optimizer) -> bool:
    """Whether the optimizer is Adam or AdamW, whose statistics need preconditioning."""
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)


def preconditioner_for(optimizer: Optimizer) -> Preconditioner | None:
    """The preconditioner the optimizer's update implies: Adam's for Adam/AdamW, else None."""
    return AdamPreconditioner(optimizer) if is_adam(optimizer) else None


_register_hook: Callable[[torch.Tensor, Callable[[torch.Tensor], None]], RemovableHandle] = (
    torch.Tensor.register_hook
)
"""`Tensor.register_hook`, typed (torch leaves it unannotated)."""


class GradientCollector:
    """Collects the squared gradient norms `GradientNoiseScale` needs, from hooks on parameters.

    A tensor hook on every parameter sees each backward pass's *local* gradient before it is
    accumulated into ``.grad`` and before any all-reduce, so it yields one gradient per
    micro-batch per replica. Hooks are installed only while some micro-batch needs them
    (`enable_hooks`), and do work only while collection is on for the current micro-batch
    (`begin_micro_batch`), so a configuration that does not need them (one replica, no
    accumulation) pays nothing for them.

    Gradients arrive multiplied by whatever the loss was multiplied by (loss weighting for
    accumulation, AMP loss scale); the caller passes that multiplier and the collector divides it
    out, so results are in units of the mean-loss gradient.

    Args:
        optimizer: The optimizer whose param groups define the statistics' groups.
        preconditioner: Elementwise gradient divisor; default: `preconditioner_for(optimizer)`.
        on_grad: Called from every hook (e.g. to time-stamp the last gradient of a backward).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        preconditioner: Preconditioner | None = None,
        *,
        on_grad: Callable[[], None] | None = None,
    ) -> None:
        self._precondition = (
            preconditioner if preconditioner is not None else preconditioner_for(optimizer)
        )
        self._groups: list[list[torch.Tensor]] = [
            [p for p in group["params"] if p.requires_grad] for group in optimizer.param_groups
        ]
        first = next((p for group in self._groups for p in group), None)
        if first is None:
            raise InvalidValueError("optimizer", "has no parameter that requires a gradient")
        self.device = first.device
        """Device the statistics live on (that of the first parameter)."""
        self._collect = False
        self._multiplier = 1.0
        self._norms: list[list[torch.Tensor]] = [[] for _ in self._groups]
        self._micro_batches = 0
        self._divisors: dict[int, torch.Tensor | None] = {}
        self._on_grad = on_grad
        self._handles: list[RemovableHandle] = []
        # Differenced estimator: the stored gradient (the tensors themselves, or a copy in a
        # reused buffer once in-place modification was seen), which parameters it covers, and
        # the version counters it had when stored.
        self._stored: list[list[torch.Tensor]] | None = None
        self._buffer: list[list[torch.Tensor]] = [[] for _ in self._groups]
        self._layout: tuple[tuple[int, ...], ...] = ()
        self._versions: list[int] = []
        self._copy = False
        self._prev_sqr: torch.Tensor | None = None

    @property
    def num_groups(self) -> int:
        """Number of parameter groups."""
        return len(self._groups)

    @property
    def micro_batches(self) -> int:
        """Micro-batches collected since the last `reset`."""
        return self._micro_batches

    @property
    def hooks_enabled(self) -> bool:
        """Whether the gradient hooks are installed."""
        return bool(self._handles)

    def params(self) -> list[torch.Tensor]:
        """Every tracked parameter, group by group."""
        return [p for group in self._groups for p in group]

    def enable_hooks(self, enabled: bool = True) -> None:
        """Install (or remove) the per-parameter gradient hooks."""
        if enabled and not self._handles:
            self._handles = [
                _register_hook(p, self._make_hook(g, p))
                for g, params in enumerate(self._groups)
                for p in params
            ]
        elif not enabled:
            self.remove()

    def remove(self) -> None:
        """Detach the hooks (`enable_hooks` can install them again)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def begin_micro_batch(self, *, collect: bool, multiplier: float = 1.0) -> None:
        """Declare the next backward pass.

        Args:
            collect: Whether to record its per-parameter gradient norms (needs the hooks).
            multiplier: Factor the loss was multiplied by (weight × AMP scale); constant over the
                micro-batches of one optimizer step.
        """
        if collect and not self._handles:
            raise InvalidValueError("collect", "needs the gradient hooks: call enable_hooks()")
        self._collect = collect
        if collect:
            if self._micro_batches and multiplier != self._multiplier:
                raise InvalidValueError(
                    "multiplier", "must stay constant across the micro-batches of one step"
                )
            self._multiplier = multiplier
            self._micro_batches += 1

    def local_sqr(self) -> torch.Tensor:
        """Σ over collected micro-batches of |g/p|², per group, in mean-loss units (float64).

        The result stays on the gradients' device (no host synchronisation), ready to be summed
        over replicas with an all-reduce. Groups with no gradient report 0.
        """
        sums = [
            torch.stack(norms).to(self.device).double().square().sum() if norms else self._zero()
            for norms in self._norms
        ]
        return torch.stack(sums) / (self._multiplier**2)

    def total_sqr(self, multiplier: float = 1.0) -> torch.Tensor:
        """|mean g / p|² per group from the parameters' ``.grad`` (float64, on device).

        Args:
            multiplier: Factor the accumulated ``.grad`` carries relative to the mean-loss
                gradient (the AMP loss scale; accumulation weights already average).
        """
        out = [
            self._sum_sqr(self._preconditioned_grads(g, params))
            for g, params in enumerate(self._groups)
        ]
        return torch.stack(out) / (multiplier**2)

    def differenced_sqr(self, multiplier: float = 1.0, *, keep: bool = True) -> torch.Tensor | None:
        """Statistics of the differenced estimator for one replica without accumulation.

        Pairs the current ``.grad`` with the gradient stored by an earlier call (consuming it)
        and, if `keep`, stores the current one for the next call. Pairing consecutive steps and
        storing every step is the published scheme; storing on one step and pairing on the
        next, every few steps, measures the same quantity at a fraction of the cost.

        Storing is free when the caller drops ``.grad`` after the step (``zero_grad`` with
        ``set_to_none``, as the trainer does): the collector keeps the gradient tensors
        themselves. If they are modified in place after being stored (their version counter
        moves, e.g. in-place gradient clipping after the statistics were read), that pair is
        discarded and the collector copies gradients into its own buffer from then on.

        Args:
            multiplier: Factor ``.grad`` carries relative to the mean-loss gradient (AMP scale).
            keep: Store the current gradient for the next call.

        Returns:
            A (2, groups) float64 tensor of [L, T] with c = 2, or None when nothing usable was
            stored (first call, after `forget_previous`, the parameters with gradients
            changed, or the stored gradient was modified).
        """
        current: list[list[torch.Tensor]] = []
        layout: list[tuple[int, ...]] = []
        aliased = True
        for g, params in enumerate(self._groups):
            present = [p for p in params if p.grad is not None]
            layout.append(tuple(id(p) for p in present))
            grads = [_dense(p.grad).detach() for p in present if p.grad is not None]
            divisors = [self._divisor(p, g) for p in present]
            if any(d is not None for d in divisors):
                grads = [t if d is None else t / d for t, d in zip(grads, divisors, strict=True)]
                aliased = False
            if multiplier != 1.0 and grads:
                grads = list(torch._foreach_mul(grads, 1.0 / multiplier))
                aliased = False
            current.append(grads)
        current_sqr = torch.stack([self._sum_sqr(group) for group in current])
        result = self._pair_with_stored(current, tuple(layout), current_sqr)
        self._stored = None
        self._prev_sqr = None
        if keep:
            self._store(current, tuple(layout), aliased)
            self._prev_sqr = current_sqr
        return result

    def _pair_with_stored(
        self,
        current: list[list[torch.Tensor]],
        layout: tuple[tuple[int, ...], ...],
        current_sqr: torch.Tensor,
    ) -> torch.Tensor | None:
        stored, prev_sqr = self._stored, self._prev_sqr
        if stored is None or prev_sqr is None or layout != self._layout:
            return None
        flat_stored = [t for group in stored for t in group]
        flat_current = [t for group in current for t in group]
        if any(a.shape != b.shape for a, b in zip(flat_stored, flat_current, strict=True)):
            return None
        if any(t._version != v for t, v in zip(flat_stored, self._versions, strict=True)):
            self._copy = True  # modified after it was read: keep private copies from now on
            return None
        if any(a is b for a, b in zip(flat_stored, flat_current, strict=True)):
            return None  # the same tensors: the gradient was not dropped between the calls
        total = []
        for before, now in zip(stored, current, strict=True):
            if not now:
                total.append(self._zero())
                continue
            torch._foreach_add_(before, now)  # the stored gradient is ours and used up here
            total.append(self._sum_sqr(before) / 4.0)
        return torch.stack([(prev_sqr + current_sqr) / 2.0, torch.stack(total)])

    def _store(
        self, current: list[list[torch.Tensor]], layout: tuple[tuple[int, ...], ...], aliased: bool
    ) -> None:
        if aliased and self._copy:
            shapes = [[t.shape for t in group] for group in current]
            if shapes != [[t.shape for t in group] for group in self._buffer]:
                self._buffer = [[torch.empty_like(t) for t in group] for group in current]
            for stored, now in zip(self._buffer, current, strict=True):
                if now:
                    torch._foreach_copy_(stored, now)
            current = self._buffer
        self._layout = layout
        self._stored = current
        self._versions = [t._version for group in current for t in group]

    def forget_previous(self) -> None:
        """Drop the stored gradient of the differenced estimator (e.g. after a skipped step)."""
        self._prev_sqr = None
        self._stored = None

    def reset(self) -> None:
        """Start a new optimizer step: clear the collected norms and cached preconditioners."""
        for norms in self._norms:
            norms.clear()
        self._micro_batches = 0
        self._divisors.clear()
        self._collect = False
        self._multiplier = 1.0

    def _zero(self) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64, device=self.device)

    def _sum_sqr(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if not tensors:
            return self._zero()
        norms = torch._foreach_norm([t.detach() for t in tensors], dtype=torch.float32)
        if {n.device for n in norms} != {self.device}:  # parameters on several devices
            norms = tuple(n.to(self.device) for n in norms)
        return torch.stack(norms).double().square().sum()

    def _divisor(self, param: torch.Tensor, group: int) -> torch.Tensor | None:
        if self._precondition is None:
            return None
        key = id(param)
        if key not in self._divisors:
            self._divisors[key] = self._precondition(param, group)
        return self._divisors[key]

    def _preconditioned_grads(self, group: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
        grads: list[torch.Tensor] = []
        for p in params:
            grad = p.grad
            if grad is None:
                continue
            grad = _dense(grad)
            divisor = self._divisor(p, group)
            grads.append(grad if divisor is None else grad / divisor)
        return grads

    def _make_hook(self, group: int, param: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self._on_grad is not None:
                self._on_grad()
            if not self._collect:
                return
            g = _dense(grad)
            divisor = self._divisor(param, group)
            if divisor is not None:
                g = g / divisor
            self._norms[group].append(torch.linalg.vector_norm(g.detach(), dtype=torch.float32))

        return hook


def _dense(grad: torch.Tensor) -> torch.Tensor:
    return grad.coalesce().values() if grad.is_sparse else grad
