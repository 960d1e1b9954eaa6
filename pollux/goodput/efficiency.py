"""Statistical efficiency from the gradient noise scale (Pollux paper §3.1, reference §1.2).

A step on a batch of M samples makes as much progress as r(S) steps on M0 samples, where
S = M / M0 and r is AdaScale's gain ratio. Efficiency is that progress per sample relative to
M0: r(S) / S = (φ + M0) / (φ + M), with φ = M0 · var / sqr the pre-conditioned noise scale.
"""

from __future__ import annotations

import numpy as np

from pollux.goodput._validate import ArrayLike, FloatArray, finite_array, finite_scalar
from pollux.goodput.params import GradParams


def gain(grad: GradParams, scale: ArrayLike) -> FloatArray:
    """AdaScale gain r(S) = (var + sqr) / (var/S + sqr): M0-steps of progress per step.

    Args:
        grad: Gradient statistics.
        scale: S = M / M0, the batch size relative to the initial batch; > 0.

    Returns:
        r(S) with the shape of `scale`; 1 ≤ r ≤ S for S ≥ 1.
    """
    s = finite_array("scale", scale, minimum=0.0, strict=True)
    return _gain(grad, s)


def _gain(grad: GradParams, scale: FloatArray) -> FloatArray:
    # GradParams rules out sqr == var == 0, so the denominator is positive for every S > 0.
    return np.asarray((grad.var + grad.sqr) / (grad.var / scale + grad.sqr), dtype=np.float64)


def efficiency(grad: GradParams, init_batch_size: float, batch_size: ArrayLike) -> FloatArray:
    """Statistical efficiency of a total batch of `batch_size` samples, in (0, 1].

    Batches below M0 count as M0: the model is only trusted at or above the reference batch, so
    it neither rewards nor penalises them (the published code asserts M ≥ M0 instead).

    Args:
        grad: Gradient statistics.
        init_batch_size: M0 (samples), > 0.
        batch_size: Total batch size M per optimizer step (samples), > 0.

    Returns:
        Efficiency with the shape of `batch_size`; non-increasing in M.
    """
    m0 = finite_scalar("init_batch_size", init_batch_size, minimum=0.0, strict=True)
    m = finite_array("batch_size", batch_size, minimum=0.0, strict=True)
    return _efficiency(grad, m0, m)


def _efficiency(grad: GradParams, init_batch_size: float, batch_size: FloatArray) -> FloatArray:
    scale = np.maximum(batch_size, init_batch_size) / init_batch_size
    return _gain(grad, scale) / scale
