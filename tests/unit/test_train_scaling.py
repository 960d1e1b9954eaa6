"""Learning-rate scaling rules: factors, identity at S = 1, SGD and Adam steps, progress, state."""

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pollux.train import (  # noqa: E402
    GradStats,
    InvalidValueError,
    ScaledOptimizer,
    ScalingRule,
    lr_factor,
)

STATS = GradStats(sqr=1.0, var=3.0)


@pytest.mark.parametrize(
    ("rule", "adam", "want"),
    [
        (ScalingRule.ADASCALE, False, (3 + 1) / (3 / 4 + 1)),
        (ScalingRule.ADASCALE, True, math.sqrt((3 + 1) / (3 / 4 + 1))),
        (ScalingRule.LINEAR, False, 4.0),
        (ScalingRule.LINEAR, True, 4.0),
        (ScalingRule.SQRT, False, 2.0),
        (ScalingRule.NONE, False, 1.0),
    ],
    ids=["adascale-sgd", "adascale-adam-is-sqrt", "linear", "linear-adam", "sqrt", "none"],
)
def test_each_rule_gives_its_factor_at_four_times_the_batch(rule, adam, want):
    assert lr_factor(rule, 4.0, STATS, adam=adam) == pytest.approx(want)


@pytest.mark.parametrize("rule", list(ScalingRule))
@pytest.mark.parametrize("adam", [False, True])
def test_scale_one_is_the_identity_for_every_rule(rule, adam):
    assert lr_factor(rule, 1.0, STATS, adam=adam) == pytest.approx(1.0)
    assert STATS.gain(1.0) == pytest.approx(1.0)


def test_adascale_factor_is_between_one_and_the_scale():
    for scale in (1.5, 2.0, 8.0, 64.0):
        factor = lr_factor(ScalingRule.ADASCALE, scale, STATS)
        assert 1.0 <= factor <= scale


def test_rule_names_parse_and_unknown_names_say_what_is_valid():
    assert ScalingRule.parse("AdaScale") is ScalingRule.ADASCALE
    assert ScalingRule.parse(ScalingRule.SQRT) is ScalingRule.SQRT
    with pytest.raises(InvalidValueError, match="adascale, linear, sqrt, none"):
        ScalingRule.parse("cubic")
    with pytest.raises(InvalidValueError, match="scale"):
        lr_factor(ScalingRule.LINEAR, 0.0, STATS)


def one_param(value=1.0):
    p = nn.Parameter(torch.tensor([value]))
    p.grad = torch.tensor([0.5])
    return p


def test_sgd_step_uses_the_scaled_rate_and_restores_the_base_rate():
    p = one_param()
    opt = torch.optim.SGD([p], lr=0.1)
    scaled = ScaledOptimizer(opt, ScalingRule.LINEAR)
    gain = scaled.step(4.0, [STATS])
    assert p.item() == pytest.approx(1.0 - 0.1 * 4.0 * 0.5)
    assert opt.param_groups[0]["lr"] == 0.1  # the user's value is back
    assert scaled.last_factors == (4.0,)
    assert gain == pytest.approx(STATS.gain(4.0))  # progress counts the gain, whatever the rule
    assert scaled.progress == pytest.approx(STATS.gain(4.0))
    assert scaled.steps == 1


def test_adam_defaults_to_the_square_root_of_the_adascale_gain():
    p = one_param()
    opt = torch.optim.Adam([p], lr=0.01)
    scaled = ScaledOptimizer(opt)
    assert scaled.adam
    assert scaled.rule is ScalingRule.ADASCALE
    scaled.step(4.0, [STATS])
    factor = math.sqrt(STATS.gain(4.0))
    # Adam's first step moves each weight by lr · sign(grad) (up to eps).
    assert p.item() == pytest.approx(1.0 - 0.01 * factor, rel=1e-5)
    assert scaled.last_factors == (pytest.approx(factor),)


def test_adamw_is_detected_as_adam():
    assert ScaledOptimizer(torch.optim.AdamW([one_param()], lr=0.01)).adam


def test_lr_schedulers_keep_acting_on_the_base_rate():
    p = one_param()
    opt = torch.optim.SGD([p], lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaled = ScaledOptimizer(opt, ScalingRule.LINEAR)
    for _ in range(3):
        scaled.step(2.0, [STATS])
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.125)  # 1 → 0.5 → 0.25 → 0.125
    # Each step used 2 × the scheduled rate: 2·(1 + 0.5 + 0.25)·0.5
    assert p.item() == pytest.approx(1.0 - 2 * 1.75 * 0.5)


def test_per_group_statistics_give_per_group_factors():
    a, b = one_param(), one_param()
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    scaled = ScaledOptimizer(opt)
    low_noise, high_noise = GradStats(sqr=1.0, var=0.01), GradStats(sqr=1.0, var=100.0)
    factors = scaled.factors(8.0, [low_noise, high_noise])
    assert factors[0] == pytest.approx(low_noise.gain(8.0))
    assert factors[1] == pytest.approx(high_noise.gain(8.0))
    assert factors[0] < factors[1]
    with pytest.raises(InvalidValueError, match="one per param group"):
        scaled.factors(8.0, [low_noise])


def test_explicit_lr_scale_overrides_the_rule():
    p = one_param()
    scaled = ScaledOptimizer(torch.optim.SGD([p], lr=0.1))
    scaled.step(4.0, [STATS], lr_scale=3.0)
    assert scaled.last_factors == (3.0,)
    assert p.item() == pytest.approx(1.0 - 0.1 * 3.0 * 0.5)


def test_a_step_that_was_not_applied_adds_no_progress():
    scaled = ScaledOptimizer(torch.optim.SGD([one_param()], lr=0.1))
    assert scaled.step(4.0, [STATS], step_fn=lambda: None, count_progress=False) == 0.0
    assert scaled.progress == 0.0
    assert scaled.steps == 0


def test_base_rate_is_restored_even_when_the_step_raises():
    opt = torch.optim.SGD([one_param()], lr=0.1)
    scaled = ScaledOptimizer(opt, ScalingRule.LINEAR)

    def boom():
        assert opt.param_groups[0]["lr"] == pytest.approx(0.4)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        scaled.step(4.0, [STATS], step_fn=boom)
    assert opt.param_groups[0]["lr"] == 0.1


def test_tensor_learning_rates_are_restored_as_the_same_tensor():
    lr = torch.tensor(0.1)
    opt = torch.optim.SGD([one_param()], lr=lr)
    scaled = ScaledOptimizer(opt, ScalingRule.SQRT)
    scaled.step(4.0, [STATS])
    assert opt.param_groups[0]["lr"] is lr


def test_state_round_trip():
    scaled = ScaledOptimizer(torch.optim.SGD([one_param()], lr=0.1))
    for _ in range(3):
        scaled.step(4.0, [STATS])
    other = ScaledOptimizer(torch.optim.SGD([one_param()], lr=0.1))
    other.load_state_dict(scaled.state_dict())
    assert other.progress == pytest.approx(scaled.progress)
    assert other.steps == 3
    assert other.last_gain == pytest.approx(scaled.last_gain)
