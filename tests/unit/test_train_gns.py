"""Gradient noise scale: estimators against analytic cases, smoothing, hooks, Adam, NaN steps."""

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from pollux.train import (  # noqa: E402
    BatchConfig,
    ElasticTrainer,
    FixedBatchConfig,
    GradientCollector,
    GradientNoiseScale,
    GradStats,
    InvalidValueError,
    TrainEnv,
    adascale_gain,
    estimate,
)
from pollux.train.gns import VAR_FLOOR, AdamPreconditioner, preconditioner_for  # noqa: E402


def sample_micro_gradients(trials, count, batch, mean, std, generator):
    """`trials` × `count` micro-batch gradients, each the mean of `batch` per-sample gradients.

    Per-sample gradients are N(mean, diag(std²)), so a micro-batch gradient is
    N(mean, diag(std²)/batch): exactly the model behind the estimators.
    """
    noise = torch.randn(trials, count, mean.numel(), generator=generator, dtype=torch.float64)
    return mean + noise * std / math.sqrt(batch)


@pytest.mark.parametrize(
    ("count", "batch", "init_batch"),
    [(2, 16, 16), (4, 8, 32), (8, 32, 64), (3, 5, 15)],
    ids=["two-gradients", "four-replicas", "eight-micro-batches", "odd-sizes"],
)
def test_estimators_are_unbiased_for_known_mean_and_covariance(count, batch, init_batch):
    gen = torch.Generator().manual_seed(1)
    dim = 64
    mean = torch.randn(dim, generator=gen, dtype=torch.float64) * 0.3
    std = torch.rand(dim, generator=gen, dtype=torch.float64) * 2 + 0.5
    want_sqr = float(mean.square().sum())
    want_var = float(std.square().sum()) / init_batch  # tr(Σ)/M0
    grads = sample_micro_gradients(20000, count, batch, mean, std, gen)
    local = grads.square().sum(-1).mean(-1)  # L per trial
    total = grads.mean(1).square().sum(-1)  # T per trial
    scale = count * batch / init_batch
    sqr, var = estimate(local, total, count, scale)
    assert float(sqr.mean()) == pytest.approx(want_sqr, rel=0.05)
    assert float(var.mean()) == pytest.approx(want_var, rel=0.03)


def test_estimate_rejects_a_single_gradient_and_bad_scale():
    with pytest.raises(InvalidValueError, match="at least 2"):
        estimate(1.0, 1.0, 1, 1.0)
    with pytest.raises(InvalidValueError, match="scale"):
        estimate(1.0, 1.0, 2, 0.0)


def test_first_update_is_the_raw_estimate_then_the_average_moves_slowly():
    gns = GradientNoiseScale(1)
    assert not gns.measured
    assert gns.stats == GradStats(sqr=1.0, var=VAR_FLOOR)  # neutral: gain ≈ 1
    assert gns.gain(8.0) == pytest.approx(1.0, abs=1e-5)
    want = estimate(3.0, 1.0, 4, 2.0)
    assert gns.update([3.0], [1.0], 4, 2.0)
    assert gns.stats.sqr == pytest.approx(want[0])
    assert gns.stats.var == pytest.approx(want[1])
    gns.update([30.0], [10.0], 4, 2.0)  # ten times larger
    assert want[0] < gns.stats.sqr < 10 * want[0]
    assert gns.updates == 2


def test_smoothing_converges_to_a_constant_input_and_counts_large_batches_more():
    small, large = GradientNoiseScale(1), GradientNoiseScale(1)
    for gns, scale in ((small, 1.0), (large, 8.0)):
        gns.update([2.0], [1.5], 2, scale)  # sqr estimate 1
        for _ in range(50):
            gns.update([6.0], [4.0], 2, scale)  # sqr estimate 2
    target_sqr = estimate(6.0, 4.0, 2, 1.0)[0]
    assert target_sqr == 2.0
    # θ = 0.999^S: a step of 8·M0 samples moves the average further than one of M0.
    assert abs(large.stats.sqr - target_sqr) < abs(small.stats.sqr - target_sqr)


def test_non_finite_statistics_are_skipped_and_never_folded_in():
    gns = GradientNoiseScale(2)
    gns.update([3.0, 2.0], [1.0, 1.0], 4, 2.0)
    before = gns.state_dict()
    assert not gns.update([math.nan, 2.0], [1.0, 1.0], 4, 2.0)
    assert not gns.update([3.0, 2.0], [math.inf, 1.0], 4, 2.0)
    assert gns.skipped == 2
    after = gns.state_dict()
    assert after["sqr_biased"] == before["sqr_biased"]
    assert after["var_biased"] == before["var_biased"]


def test_groups_are_clamped_and_summed():
    gns = GradientNoiseScale(2)
    # Group 0 has T > L (negative var estimate), group 1 has c·T < L (negative sqr).
    gns.update([1.0, 10.0], [2.0, 1.0], 2, 1.0)
    g0, g1 = gns.group_stats()
    assert g0.var == VAR_FLOOR
    assert g1.sqr == 0.0
    assert gns.stats.sqr == pytest.approx(g0.sqr + g1.sqr)
    assert gns.stats.var == pytest.approx(g0.var + g1.var)


def test_leaving_the_differenced_estimator_resets_the_averages():
    gns = GradientNoiseScale(1)
    gns.update([10.0], [1.0], 2, 2.0, differenced=True)
    gns.update([4.0], [3.0], 4, 2.0)
    assert gns.stats.sqr == pytest.approx(estimate(4.0, 3.0, 4, 2.0)[0])


def test_state_round_trip_and_group_mismatch():
    gns = GradientNoiseScale(1)
    gns.update([3.0], [1.0], 4, 2.0)
    other = GradientNoiseScale(1)
    other.load_state_dict(gns.state_dict())
    assert other.stats == gns.stats
    with pytest.raises(InvalidValueError, match="param groups"):
        GradientNoiseScale(2).load_state_dict(gns.state_dict())


def test_gain_and_efficiency_follow_the_reference_formula():
    stats = GradStats(sqr=0.00136, var=0.000502)
    m0 = 128
    assert stats.efficiency(1280 / m0) == pytest.approx(0.132038, rel=1e-4)  # reference §1.6
    assert stats.gain(1.0) == pytest.approx(1.0)
    phi = stats.pgns(m0)
    assert stats.efficiency(10.0) == pytest.approx((phi + m0) / (phi + 10 * m0))
    assert adascale_gain(0.0, 1.0, 4.0) == pytest.approx(4.0)  # sqr = 0: perfect scaling
    assert adascale_gain(0.0, 0.0, 4.0) == 1.0


def linear_problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    model = nn.Linear(6, 2)
    x = torch.randn(16, 6, generator=gen)
    y = torch.randn(16, 2, generator=gen)
    return model, x, y


def grad_of(model, x, y):
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).clone()


def test_collector_sees_each_micro_batch_gradient_before_accumulation():
    model, x, y = linear_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g1, g2 = grad_of(model, x[:8], y[:8]), grad_of(model, x[8:], y[8:])
    model.zero_grad(set_to_none=True)
    collector = GradientCollector(opt)
    assert collector.num_groups == 1
    assert not collector.hooks_enabled  # installed only when needed
    collector.enable_hooks()
    for xs, ys in ((x[:8], y[:8]), (x[8:], y[8:])):
        collector.begin_micro_batch(collect=True, multiplier=0.5)
        (0.5 * nn.functional.mse_loss(model(xs), ys)).backward()
    local = collector.local_sqr()
    total = collector.total_sqr()
    assert collector.micro_batches == 2
    assert float(local[0]) == pytest.approx(float(g1.square().sum() + g2.square().sum()), 1e-5)
    assert float(total[0]) == pytest.approx(float(((g1 + g2) / 2).square().sum()), 1e-5)
    collector.reset()
    assert float(collector.local_sqr()[0]) == 0.0
    collector.remove()


def test_collector_is_idle_when_not_collecting():
    model, x, y = linear_problem()
    collector = GradientCollector(torch.optim.SGD(model.parameters(), lr=0.1))
    collector.enable_hooks()
    collector.begin_micro_batch(collect=False)
    nn.functional.mse_loss(model(x), y).backward()
    assert float(collector.local_sqr().sum()) == 0.0


def test_differenced_estimator_pairs_consecutive_gradients():
    model, x, y = linear_problem()
    collector = GradientCollector(torch.optim.SGD(model.parameters(), lr=0.1))
    g1 = grad_of(model, x[:8], y[:8])
    assert collector.differenced_sqr() is None  # first call only stores
    g2 = grad_of(model, x[8:], y[8:])
    local, total = collector.differenced_sqr().tolist()
    assert local[0] == pytest.approx(float((g1.square().sum() + g2.square().sum()) / 2), 1e-5)
    assert total[0] == pytest.approx(float(((g1 + g2) / 2).square().sum()), 1e-5)
    collector.forget_previous()
    assert collector.differenced_sqr() is None


def test_adam_and_adamw_get_the_preconditioned_variant_sgd_does_not():
    model, _, _ = linear_problem()
    assert isinstance(preconditioner_for(torch.optim.Adam(model.parameters())), AdamPreconditioner)
    assert isinstance(preconditioner_for(torch.optim.AdamW(model.parameters())), AdamPreconditioner)
    assert preconditioner_for(torch.optim.SGD(model.parameters(), lr=0.1)) is None


def test_adam_preconditioner_divides_by_adams_denominator_after_warmup():
    model, x, y = linear_problem()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-6)
    collector = GradientCollector(opt)
    collector.enable_hooks()
    for step in range(7):
        collector.reset()
        collector.begin_micro_batch(collect=True)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        local = float(collector.local_sqr()[0])
        plain = sum(float(p.grad.square().sum()) for p in model.parameters())
        if step < 5:
            assert local == pytest.approx(plain, rel=1e-5)  # identity while Adam warms up
        else:
            want = 0.0
            for p in model.parameters():
                state = opt.state[p]
                t = float(state["step"])
                denom = (state["exp_avg_sq"] / (1 - 0.99**t)).sqrt() + 1e-6
                want += float((p.grad / denom).square().sum())
            assert local == pytest.approx(want, rel=1e-4)
            assert local != pytest.approx(plain, rel=1e-2)
        opt.step()


def small_trainer(**kwargs):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model = nn.Linear(4, 1)
    trainer = ElasticTrainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        init_batch_size=8,
        env=TrainEnv(),
        batch_source=FixedBatchConfig(BatchConfig(8, 2)),
        checkpointing=False,
        handle_sigterm=False,
        **{"stats_interval": 1, **kwargs},
    )
    return trainer, model


def test_nan_gradients_are_never_fed_to_the_statistics():
    trainer, _ = small_trainer()
    for i, (x, y) in enumerate(trainer.batches()):
        loss = nn.functional.mse_loss(trainer.model(x), y)
        if i == 4:  # first micro-batch of the third optimizer step
            loss = loss * float("nan")
            stats = trainer.gns.state_dict()
        trainer.step(loss)
        if i == 5:
            after = trainer.gns.state_dict()
            assert after["sqr_biased"] == stats["sqr_biased"]
            assert after["var_biased"] == stats["var_biased"]
        if i == 5:
            break
    assert trainer.gns.skipped == 1
    assert trainer.gns.updates == 2
    trainer.close()


def test_amp_overflow_skips_the_statistics_the_update_and_the_progress():
    scaler = torch.amp.GradScaler("cpu")
    trainer, model = small_trainer(grad_scaler=scaler)
    for i, (x, y) in enumerate(trainer.batches()):
        loss = nn.functional.mse_loss(trainer.model(x), y)
        if i == 4:  # overflow in the third optimizer step
            loss = loss * float("inf")
            weights = [p.detach().clone() for p in model.parameters()]
            progress = trainer.progress
        applied = trainer.step(loss)
        if i == 5:
            assert applied  # the step ended, though AMP skipped the update
            for before, p in zip(weights, model.parameters(), strict=True):
                assert torch.equal(before, p)
            assert trainer.progress == progress
    assert trainer.gns.skipped == 1
    assert trainer.gns.updates == 3  # 4 steps of 16 samples, one overflowed
    assert trainer.steps == 3
    assert scaler.get_scale() < 65536.0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    trainer.close()


def test_statistics_measured_every_few_steps_keep_the_published_forgetting_rate():
    # M0 = 8 and M = 16: stats_interval counts M0-batches, so 4 means every second step.
    every, sparse = small_trainer(stats_interval=1)[0], small_trainer(stats_interval=4)[0]
    for trainer in (every, sparse):
        for x, y in trainer.batches():
            trainer.step(nn.functional.mse_loss(trainer.model(x), y))
        trainer.close()
    assert every.gns.updates == 4
    assert sparse.gns.updates == 2
    # Both forget the neutral start at the same rate per step: the bias correction matches.
    assert every.gns.state_dict()["unbias"] == pytest.approx(sparse.gns.state_dict()["unbias"])
