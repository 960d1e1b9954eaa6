"""The Pareto benchmark's variants (benchmarks/beyond_pollux.py): each simulates what it names."""

from dataclasses import replace

from benchmarks.beyond_pollux import (
    EVENT_DELAY,
    VARIANTS,
    build_tasks,
    make_config,
    parse_args,
    variant_policy,
)
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.registry import PolicySpec, make_policy


def test_event_variants_run_the_live_schedulers_rounds_and_the_others_the_published_ones():
    args = parse_args(["--loads", "0.5", "--workloads", "1", "--variants", ",".join(VARIANTS)])
    tasks = build_tasks(args, make_config(args))
    assert {t.variant for t in tasks} == set(VARIANTS)
    for task in tasks:
        kind = {"events": "full", "place": "place"}.get(task.variant.rsplit("-", 1)[-1])
        assert task.config.event_delay == (None if kind is None else EVENT_DELAY), task.variant
        assert task.config.event_rounds == (kind or "full"), task.variant
        assert task.config.interval == 60.0


def test_the_faithful_variants_run_faithful_pollux_and_the_jct_ones_the_mode():
    assert VARIANTS["faithful"].jct is None
    assert VARIANTS["faithful-events"].jct is None
    assert VARIANTS["jct"].jct is not None
    assert VARIANTS["jct-events"].jct == VARIANTS["jct"].jct
    assert VARIANTS["faithful-place"].jct is None
    assert VARIANTS["jct-place"].jct == VARIANTS["jct"].jct


def test_the_start_1_variants_start_new_jobs_on_one_gpu_as_pollux_does():
    mode = VARIANTS["jct"].jct
    assert mode is not None
    assert mode.exploration.start == mode.explore_growth == 4
    for name in ("jct-start-1", "jct-start-1-place"):
        jct = VARIANTS[name].jct
        assert jct is not None
        assert jct.exploration == replace(mode.exploration, start=1)


def test_supported_variants_come_from_the_registry_and_ablations_live_here_only():
    assert variant_policy("faithful", 30.0) == make_policy(PolicySpec("pollux"))
    assert variant_policy("jct-place", 30.0) == make_policy(PolicySpec("pollux-jct"))
    holding = make_policy(PolicySpec("pollux-jct", jct_restart="holding", restart_delay_s=5.0))
    assert variant_policy("jct-holding", 5.0) == holding
    ablation = variant_policy("jct-no-weights", 30.0)
    assert ablation.name == "pollux-jct"
    assert isinstance(ablation, PolluxPolicy)
    assert ablation.jct is not None
    assert not ablation.jct.rank_weights
