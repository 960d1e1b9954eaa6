"""One replica's step machinery alone: timing, mixed precision, gradient statistics, the
group's local collectives, and `OptimizerSteps` driving them without a trainer."""

import pytest

torch = pytest.importorskip("torch")

import structlog  # noqa: E402
from torch import nn  # noqa: E402

from pollux.train import (  # noqa: E402
    AdaptiveDataLoader,
    BatchConfig,
    MicroBatchInfo,
    ScaledOptimizer,
    StepProfile,
    TrainEnv,
    plan_step,
)
from pollux.train.amp import MixedPrecision  # noqa: E402
from pollux.train.config import TrainerConfig  # noqa: E402
from pollux.train.distributed import Replicas, no_sync_unless_synchronising  # noqa: E402
from pollux.train.gns import GradientNoiseScale, estimate  # noqa: E402
from pollux.train.measurement import GradientMeasurement  # noqa: E402
from pollux.train.steps import OptimizerSteps  # noqa: E402
from pollux.train.timing import StepTimer  # noqa: E402

CPU = torch.device("cpu")
LOG = structlog.get_logger("test")


def alone(**env):
    return Replicas.join(TrainEnv(**env), CPU)


def infos(config, *, replicas=1, available=1000):
    plan = plan_step(0, available, replicas, 0, config)
    count = len(plan.slices)
    return [MicroBatchInfo(0, 0, j, count, n, plan) for j, (_, n) in enumerate(plan.slices)]


# -- the group, seen from one process --------------------------------------------------------


def test_one_replica_is_its_own_group():
    group = alone()
    assert (group.rank, group.world_size, group.num_nodes, group.leader) == (0, 1, 1, True)
    assert group.comm_device == CPU
    assert group.any(True)
    assert not group.any(False)
    assert group.from_leader({"a": 1}) == {"a": 1}
    assert group.start_sum([1.0, 2.0], torch.tensor([3.0])).result() == [1.0, 2.0, 3.0]
    assert group.wrap(nn.Linear(1, 1), None) is None
    param = nn.Parameter(torch.ones(2))
    param.grad = torch.full((2,), 3.0)
    group.sum_gradients([param])  # nothing to sum with
    assert torch.equal(param.grad, torch.full((2,), 3.0))
    assert no_sync_unless_synchronising(None, infos(BatchConfig(2, 2))[0]) is not None


# -- timing ------------------------------------------------------------------------------------


def test_the_timer_records_a_step_after_warm_up_with_its_accumulation_batches():
    profile = StepProfile()
    timer = StepTimer(CPU, profile, num_nodes=1, num_replicas=1, warmup_steps=1)
    config = BatchConfig(4, accum_steps=3)
    for _ in range(3):  # one warm-up step, then two recorded ones
        timer.begin_step()
        for info in infos(config):
            timer.begin_micro(info)
            start = timer.mark()
            timer.backward_done()
            timer.end_micro(info, start, timer.mark())
    (observation,) = profile.observations()
    assert observation.key == (1, 1, 4, 3)
    assert observation.count == 2
    timer.restart_warmup()
    timer.begin_step()
    for info in infos(config):
        timer.begin_micro(info)
        timer.end_micro(info, timer.mark(), timer.mark())
    assert profile.observations()[0].count == 2  # warm-up again after a configuration change


def test_an_irregular_step_is_never_timed():
    profile = StepProfile()
    timer = StepTimer(CPU, profile, num_nodes=1, num_replicas=2, warmup_steps=0)
    timer.begin_step()
    for info in infos(BatchConfig(4), replicas=2, available=3):
        timer.begin_micro(info)
        timer.on_grad()
        timer.backward_done()
        timer.end_micro(info, timer.mark(), timer.mark())
    assert profile.observations() == ()


# -- mixed precision ---------------------------------------------------------------------------


def sgd_step(amp, grad):
    param = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=1.0)
    scaling = ScaledOptimizer(opt, "none")
    amp.begin_step()
    param.grad = grad.clone()
    stats = GradientNoiseScale(1).group_stats()
    applied = amp.step(scaling, opt, scale=1.0, stats=stats, lr_scale=None)
    return applied, param.detach(), scaling.progress


def test_without_a_scaler_every_step_is_applied_and_counted():
    amp = MixedPrecision(None)
    assert amp.scale(torch.tensor(2.0)) == 2.0
    applied, param, progress = sgd_step(amp, torch.ones(2))
    assert applied
    assert torch.equal(param, -torch.ones(2))
    assert progress == 1.0
    assert amp.state_dict() is None


def test_an_overflowing_step_is_skipped_and_not_counted():
    amp = MixedPrecision(torch.amp.GradScaler("cpu", init_scale=4.0))
    amp.begin_step()
    assert amp.loss_scale == 4.0
    assert amp.scale(torch.tensor(1.0)) == 4.0
    applied, param, progress = sgd_step(amp, torch.tensor([float("inf"), 0.0]))
    assert not applied
    assert torch.equal(param, torch.zeros(2))
    assert progress == 0.0
    assert amp.loss_scale < 4.0  # backed off, and kept for the next step
    assert amp.state_dict() is not None


# -- gradient statistics -----------------------------------------------------------------------


def test_measured_norms_of_an_accumulated_step_are_those_of_its_micro_batches():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    measure = GradientMeasurement(
        opt,
        alone(),
        init_batch_size=8,
        stats_interval=1,
        amp=MixedPrecision(None),
        on_grad=lambda: None,
        log=LOG,
    )
    micro = infos(BatchConfig(4, accum_steps=2))
    duties = measure.begin_step(micro[0].plan, step=0, until_agreement=1)
    assert (duties.measure, duties.collect, duties.agree) == (True, True, False)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    grads = []
    for j in range(2):
        measure.begin_micro(0.5)
        batch = slice(4 * j, 4 * j + 4)
        reference = nn.Linear(3, 1)
        reference.load_state_dict(model.state_dict())
        nn.functional.mse_loss(reference(x[batch]), y[batch]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in reference.parameters()]))
        (nn.functional.mse_loss(model(x[batch]), y[batch]) * 0.5).backward()

    def no_agreement(tail):
        raise AssertionError("one replica never agrees")

    captured = measure.capture(micro[0].plan, no_agreement)
    local = float(sum(g.square().sum() for g in grads))
    total = float(((grads[0] + grads[1]) / 2).square().sum())
    assert float(captured.local.sum()) == pytest.approx(local, rel=1e-5)
    assert float(captured.total.sum()) == pytest.approx(total, rel=1e-5)
    measure.update(1.0, captured, None, step=0)
    assert measure.gns.updates == 1
    sqr, var = estimate(local / 2, total, 2, 1.0)  # one measurement: the estimate itself
    state = measure.gns.state_dict()
    assert state["sqr_biased"][0] / state["unbias"] == pytest.approx(sqr, rel=1e-4)
    assert state["var_biased"][0] / state["unbias"] == pytest.approx(var, rel=1e-4)


# -- the whole step, without a trainer ---------------------------------------------------------


def test_optimizer_steps_drive_a_loop_the_caller_owns():
    torch.manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    loader = AdaptiveDataLoader(data, BatchConfig(4, accum_steps=2), shuffle=False)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profile = StepProfile()
    steps = OptimizerSteps(
        opt,
        alone(),
        init_batch_size=8,
        config=TrainerConfig.of(),
        profile=profile,
        amp=MixedPrecision(None),
        scaling=ScaledOptimizer(opt, "adascale"),
        stop_requested=lambda: False,
        proposal=lambda: BatchConfig(8),
        log=LOG,
    )
    before = [p.detach().clone() for p in model.parameters()]
    outcomes = []
    steps.restart()
    for micro in loader.micro_batches():
        steps.begin_micro(micro.info)
        start = steps.timer.mark()
        x, y = micro.data
        steps.backward(nn.functional.mse_loss(model(x), y))
        info = steps.state.check_step()
        if info.is_last:
            outcomes.append(steps.finish(info))
            loader.finish_step()
        steps.end_micro(micro.info, start, steps.timer.mark())
    assert len(outcomes) == 4  # 32 samples, 8 per optimizer step
    assert all(o.applied for o in outcomes)
    assert outcomes[0].agreed.config == BatchConfig(8)  # one replica: its own proposal
    assert steps.state.finished_steps == 4
    assert steps.scaling.steps == 4
    assert steps.measurement.gns.measured
    assert profile.observations()[0].count == 3  # one warm-up step
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
