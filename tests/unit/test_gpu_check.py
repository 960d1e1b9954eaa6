"""The GPU check's pure helpers (benchmarks/gpu_check.py): verdict lines, the JSON summary,
the replicas' tagged records, the probe's and the elastic job's judgements."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu_check import (
    PROBE_TAG,
    Result,
    epoch_records,
    format_result,
    overhead_pct,
    parse_records,
    probe_problems,
    resume_problems,
    sample_span,
    summary,
    worlds_in_order,
)


def probe(rank: int, world: int, *, cuda: bool, **changes: object) -> dict[str, object]:
    """A probe record as a healthy replica prints it."""
    record: dict[str, object] = {
        "rank": rank,
        "world": world,
        "cuda_visible_devices": str(rank) if cuda else "",
        "device": "cuda:0" if cuda else "cpu",
        "device_name": "NVIDIA H200" if cuda else "",
        "backend": "nccl" if cuda else "gloo",
        "group_world": world,
        "allreduce_ok": True,
    }
    return record | changes


def test_a_verdict_line_names_status_number_and_check() -> None:
    line = format_result(Result(3, "PASS", "nccl all-reduce over 2 replicas"))
    assert line == "PASS  3 all-reduce: nccl all-reduce over 2 replicas"


def test_the_summary_fails_on_any_fail_but_not_on_a_skip() -> None:
    passing = [Result(1, "SKIP", "SKIP: no CUDA"), Result(2, "PASS", "ok", {"ms": 1.5})]
    result = summary(passing, cuda=False)
    assert result["ok"]
    assert result["counts"] == {"PASS": 1, "FAIL": 0, "SKIP": 1}
    assert result["checks"][1] == {
        "name": "device-mapping",
        "number": 2,
        "status": "PASS",
        "summary": "ok",
        "figures": {"ms": 1.5},
    }
    assert result["cuda"] is False
    assert not summary([*passing, Result(5, "FAIL", "slow")])["ok"]
    json.dumps(result)  # what --out writes


def test_tagged_records_are_read_among_other_output() -> None:
    lines = [
        "loading ...",
        f'{PROBE_TAG} {{"rank": 0, "ok": true}}',
        f"{PROBE_TAG} not json",
        f"{PROBE_TAG}_OTHER {{}}",
        f'  {PROBE_TAG} {{"rank": 1}}  ',
        f"{PROBE_TAG} [1, 2]",
    ]
    assert parse_records(lines, PROBE_TAG) == [{"rank": 0, "ok": True}, {"rank": 1}]


def test_overhead_is_the_median_ratio_less_one_in_percent() -> None:
    assert overhead_pct([1.02, 1.10, 1.04]) == pytest.approx(4.0)
    assert overhead_pct([0.98, 1.0]) == pytest.approx(-1.0)


def test_healthy_probes_pass_on_gpus_and_on_cpu_slots() -> None:
    assert probe_problems([probe(0, 2, cuda=True), probe(1, 2, cuda=True)], cuda=True) == []
    assert probe_problems([probe(1, 2, cuda=False), probe(0, 2, cuda=False)], cuda=False) == []


def test_probe_problems_name_what_is_wrong() -> None:
    assert probe_problems([], cuda=True) == ["no replica printed a probe record"]
    missing = probe_problems([probe(0, 2, cuda=True)], cuda=True)
    assert missing == ["ranks [0] reported, want 0..1"]
    shared = [probe(0, 2, cuda=True), probe(1, 2, cuda=True, cuda_visible_devices="0")]
    assert probe_problems(shared, cuda=True) == [
        "replicas share GPUs: CUDA_VISIBLE_DEVICES ['0', '0']"
    ]
    gloo = probe_problems([probe(0, 1, cuda=True, backend="gloo")], cuda=True)
    assert gloo == ["rank 0: backend gloo, want nccl"]
    on_cpu = probe_problems([probe(0, 1, cuda=True, device="cpu")], cuda=True)
    assert on_cpu == ["rank 0: CUDA_VISIBLE_DEVICES='0', device cpu"]
    wrong = probe_problems([probe(0, 1, cuda=False, allreduce_ok=False)], cuda=False)
    assert wrong == ["rank 0: wrong all-reduce sum"]
    visible = probe_problems([probe(0, 1, cuda=False, cuda_visible_devices="0")], cuda=False)
    assert visible == ["rank 0: CUDA_VISIBLE_DEVICES='0', device cpu"]


def test_replica_counts_are_matched_in_order() -> None:
    assert worlds_in_order([1, 2, 2, 1], [1, 2, 1])
    assert worlds_in_order([1, 1], [1, 1])
    assert not worlds_in_order([2, 1, 2], [1, 2, 1])
    assert not worlds_in_order([1], [1, 1])


def test_each_generation_must_resume_where_the_last_stopped() -> None:
    assert resume_problems([(1, 0, 127), (2, 128, 300), (3, 300, 400)]) == []
    assert resume_problems([(1, 0, 127), (2, 0, 99)]) == [
        "generation 2 started at step 0 after generation 1 trained to step 127"
    ]
    assert resume_problems([(1, 0, 127), (2, 140, 200)]) == [
        "generation 2 started at step 140 after generation 1 trained to step 127"
    ]


def test_a_sample_log_gives_its_span_from_complete_lines_only() -> None:
    log = "3 0 2 1 128 5 9 11\n3 0 2 1 129 4 7\n3 0 2 1 13"
    assert sample_span(log) == (3, 2, 128, 129)
    assert sample_span("") is None
    assert sample_span("3 0 2 1") is None  # no line ended yet


def test_epoch_records_skip_a_line_still_being_written() -> None:
    text = '{"epoch": 0, "generation": 1}\n{"epoch": 1, "gen'
    assert epoch_records(text) == [{"epoch": 0, "generation": 1}]
