"""The trainer's settings: groups checked when built, and the flat keywords mapped onto them."""

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from pollux.train import (  # noqa: E402
    CheckpointConfig,
    ControlConfig,
    DataConfig,
    ElasticTrainer,
    InvalidValueError,
    MeasureConfig,
)
from pollux.train.config import (  # noqa: E402
    DEFAULT_CHECKPOINT_INTERVAL_S,
    KEYWORDS,
    TrainerConfig,
    with_keywords,
)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: CheckpointConfig(interval_s=0), "checkpoint_interval_s"),
        (lambda: MeasureConfig(stats_interval=0), "stats_interval"),
        (lambda: MeasureConfig(stats_interval=True), "stats_interval"),
        (lambda: MeasureConfig(profile_warmup_steps=-1), "profile_warmup_steps"),
        (lambda: MeasureConfig(report_interval_s=0), "report_interval_s"),
        (lambda: ControlConfig(config_poll_interval_s=-1), "config_poll_interval_s"),
        (lambda: ControlConfig(agreement_period_s=float("nan")), "agreement_period_s"),
    ],
)
def test_a_bad_value_is_refused_when_its_group_is_built(build, name):
    with pytest.raises(InvalidValueError, match=name):
        build()


def test_the_defaults_are_the_documented_ones():
    config = TrainerConfig.of()
    assert config.checkpoint.interval_s == DEFAULT_CHECKPOINT_INTERVAL_S == 300.0
    assert config.measure == MeasureConfig(stats_interval=8, profile_warmup_steps=1)
    assert config.control.connect_agent
    assert config.control.handle_sigterm
    assert config.data.shuffle
    assert config.data.num_workers == 0
    assert CheckpointConfig(interval_s=None).interval_s is None  # only on stop and at the end


def test_every_flat_keyword_lands_in_its_group():
    values = {
        "shuffle": False,
        "seed": 7,
        "collate_fn": list,
        "num_workers": 2,
        "pin_memory": True,
        "checkpoint_dir": "/tmp/ckpt",
        "checkpointing": False,
        "checkpoint_interval_s": 60.0,
        "stats_interval": 3,
        "profile_warmup_steps": 0,
        "report_interval_s": 0.5,
        "connect_agent": False,
        "handle_sigterm": False,
        "config_poll_interval_s": 2.0,
        "agreement_period_s": 0.25,
    }
    assert set(values) == set(KEYWORDS)
    config = with_keywords(TrainerConfig.of(), values)
    for keyword, (group, field) in KEYWORDS.items():
        assert getattr(getattr(config, group), field) == values[keyword], keyword


def test_keywords_apply_over_a_given_group_and_unknown_ones_are_a_type_error():
    given = TrainerConfig.of(measure=MeasureConfig(stats_interval=4, report_interval_s=9.0))
    config = with_keywords(given, {"stats_interval": 2})
    assert config.measure == MeasureConfig(stats_interval=2, report_interval_s=9.0)
    with pytest.raises(TypeError, match="checkpoint_directory"):
        with_keywords(given, {"checkpoint_directory": "/x"})
    with pytest.raises(InvalidValueError, match="stats_interval"):
        with_keywords(given, {"stats_interval": 0})


def test_the_trainer_takes_groups_or_the_flat_keywords_of_earlier_versions(tmp_path):
    def trainer(**kwargs):
        model = nn.Linear(2, 1)
        data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return ElasticTrainer(model, opt, data, init_batch_size=4, **kwargs)

    grouped = trainer(
        data=DataConfig(shuffle=False, seed=3),
        checkpoint=CheckpointConfig(directory=tmp_path, interval_s=None),
        measure=MeasureConfig(stats_interval=2),
        control=ControlConfig(connect_agent=False, handle_sigterm=False),
    )
    flat = trainer(
        shuffle=False,
        seed=3,
        checkpoint_dir=tmp_path,
        checkpoint_interval_s=None,
        stats_interval=2,
        connect_agent=False,
        handle_sigterm=False,
    )
    assert grouped.config == flat.config
    assert grouped.checkpoints.directory == tmp_path
    assert grouped.checkpoint_interval_s is None
    for t in (grouped, flat):
        t.close()
    with pytest.raises(TypeError, match="shufle"):
        trainer(shufle=False)
