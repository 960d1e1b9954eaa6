"""Fitting the throughput model: recovery, identifiability rules, robustness, thread safety."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pollux.goodput import (
    FitError,
    PerfParams,
    SyncModel,
    fit_perf_params,
    step_times,
)

# A realistic spread of configurations: 1–8 nodes, 1–32 GPUs, several per-GPU batch sizes.
NODES = np.array([1, 1, 1, 1, 2, 2, 2, 3, 4, 4, 8, 8])
REPLICAS = np.array([1, 2, 3, 4, 2, 4, 8, 6, 4, 16, 16, 32])
ATOMIC = np.array([32, 64, 128, 256, 64, 128, 32, 96, 64, 128, 48, 256])


def synthetic(perf: PerfParams, noise: float = 0.0, seed: int = 0):
    accum, optim = step_times(perf, NODES, REPLICAS, ATOMIC)
    rng = np.random.default_rng(seed)
    return (
        accum * np.exp(noise * rng.standard_normal(accum.shape)),
        optim * np.exp(noise * rng.standard_normal(optim.shape)),
    )


@pytest.mark.parametrize("sync_model", list(SyncModel), ids=lambda m: f"{m.value} sync")
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3], ids=["sub-millisecond", "seconds", "hours"])
def test_fit_recovers_known_parameters_from_exact_observations(sync_model, scale):
    true = PerfParams(
        0.02 * scale,
        0.0007 * scale,
        0.15 * scale,
        0.05 * scale,
        0.03 * scale,
        0.004 * scale,
        2.0,
        sync_model=sync_model,
    )
    accum, optim = synthetic(true)
    fit = fit_perf_params(NODES, REPLICAS, ATOMIC, accum, optim, sync_model=sync_model)
    assert fit.converged
    assert not fit.pinned
    got = fit.params
    # Well-identified parameters come back closely; the priors bias the rest only slightly.
    assert got.alpha_c == pytest.approx(true.alpha_c, rel=0.01)
    assert got.beta_c == pytest.approx(true.beta_c, rel=0.01)
    assert got.alpha_n == pytest.approx(true.alpha_n, rel=0.05)
    assert got.gamma == pytest.approx(true.gamma, rel=0.05)
    # Predictions everywhere, including unobserved allocations, match the truth.
    nodes, replicas = np.array([1, 2, 6, 16]), np.array([2, 8, 24, 64])
    _, want = step_times(true, nodes, replicas, 100)
    _, pred = step_times(got, nodes, replicas, 100)
    np.testing.assert_allclose(pred, want, rtol=0.02)


def test_fit_tolerates_measurement_noise():
    true = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)
    accum, optim = synthetic(true, noise=0.03, seed=7)
    got = fit_perf_params(NODES, REPLICAS, ATOMIC, accum, optim).params
    _, want = step_times(true, NODES, REPLICAS, ATOMIC)
    _, pred = step_times(got, NODES, REPLICAS, ATOMIC)
    assert np.median(np.abs(pred / want - 1)) < 0.03


def test_fit_accepts_plain_python_sequences():
    fit = fit_perf_params([1, 1, 2], [1, 2, 4], [32, 64, 64], [0.05, 0.08, 0.08], [0.06, 0.1, 0.2])
    assert fit.converged
    assert isinstance(fit.params, PerfParams)


def test_one_batch_size_pins_alpha_c_to_half_the_mean_compute_time():
    fit = fit_perf_params([1, 1], [1, 2], [64, 64], [0.1, 0.12], [0.1, 0.15])
    assert "alpha_c" in fit.pinned
    assert fit.params.alpha_c == pytest.approx(0.055)


def test_single_node_data_pins_network_terms_and_applies_the_cross_node_prior():
    fit = fit_perf_params(
        [1, 1, 1, 1],
        [1, 2, 3, 4],
        [64, 64, 128, 128],
        [0.1, 0.1, 0.18, 0.18],
        [0.1, 0.13, 0.22, 0.23],
    )
    assert {"alpha_n", "beta_n"} <= fit.pinned
    p = fit.params
    assert p.alpha_n >= 1.1 * p.alpha_r * (1 - 1e-12)
    assert p.beta_n >= 1.1 * p.beta_r * (1 - 1e-12)


def test_ring_model_needs_more_than_two_nodes_to_identify_network_retrogression():
    accum, optim = [0.1] * 4, [0.3, 0.35, 0.4, 0.45]
    two_nodes = fit_perf_params([2, 2, 2, 2], [2, 4, 6, 8], [32, 64, 32, 64], accum, optim)
    assert "beta_n" in two_nodes.pinned
    four_nodes = fit_perf_params([2, 2, 4, 4], [2, 4, 4, 8], [32, 64, 32, 64], accum, optim)
    assert "beta_n" not in four_nodes.pinned


def test_published_linear_model_pins_both_retrogressions_without_more_than_two_replicas():
    fit = fit_perf_params(
        [1, 2], [2, 2], [32, 64], [0.1, 0.12], [0.15, 0.3], sync_model=SyncModel.LINEAR
    )
    assert {"beta_n", "beta_r"} <= fit.pinned
    assert {"alpha_n", "alpha_r"}.isdisjoint(fit.pinned)


def test_fit_result_is_the_same_from_many_threads():
    true = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)
    accum, optim = synthetic(true, noise=0.02, seed=3)

    def run(_: int) -> tuple[float, ...]:
        return fit_perf_params(NODES, REPLICAS, ATOMIC, accum, optim).params.as_tuple()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = set(pool.map(run, range(16)))
    assert len(results) == 1


def test_more_starts_are_used_when_the_first_fails(monkeypatch):
    import pollux.goodput.fit as fit_module

    calls = []
    real = fit_module.minimize

    def first_call_fails(*args, **kwargs):
        res = real(*args, **kwargs)
        calls.append(res)
        if len(calls) <= 2:
            res.success = False
            res.message = "forced failure"
        return res

    monkeypatch.setattr(fit_module, "minimize", first_call_fails)
    fit = fit_perf_params(
        NODES, REPLICAS, ATOMIC, *synthetic(PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0))
    )
    assert fit.starts == 3
    assert fit.converged


def test_fit_error_when_no_start_gives_a_finite_loss(monkeypatch):
    import pollux.goodput.fit as fit_module

    class Broken:
        fun = float("nan")
        x = np.full(7, np.nan)
        success = False
        message = "diverged"

    monkeypatch.setattr(fit_module, "minimize", lambda *a, **k: Broken())
    with pytest.raises(FitError, match="diverged") as err:
        fit_perf_params([1], [1], [32], [0.1], [0.1])
    assert err.value.attempts == 4
