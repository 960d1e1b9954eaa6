"""`pollux-sim compare`: metrics of hand-made runs, the published reference, table and plot."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from pollux.sim.report import (
    ReportError,
    RunSummary,
    WorkloadMetrics,
    compare_main,
    compare_table,
    load_reference,
    load_run,
    mean_jct,
    p99_jct,
    plot_jct_vs_load,
    summarize_runs,
)
from pollux.sim.traces import default_data_root

PAPER = default_data_root() / "paper-results"


# --- Builders ----------------------------------------------------------------------------------


def job(
    name: str,
    submitted: float,
    *,
    gpus: int = 0,
    restarts: int | None = None,
    done: float | None = None,
) -> dict[str, Any]:
    """One entry of a log record's submitted_jobs; `gpus` replicas, all on node 0."""
    return {
        "name": name,
        "epoch": 0,
        "progress": 0.0,
        "num_restarts": restarts,
        "allocation": [0] * gpus,
        "placement": [gpus] if gpus else [],
        "batch_size": 0,
        "accum_steps": 0,
        "submission_time": submitted,
        "completion_time": done,
        "grad_params": None,
    }


def record(timestamp: float, *jobs: dict[str, Any], num_gpus: int = 4) -> dict[str, Any]:
    """One log record (one scheduling round)."""
    return {
        "timestamp": timestamp,
        "num_nodes": 1,
        "num_gpus": num_gpus,
        "submitted_jobs": list(jobs),
    }


def write_run(
    root: Path,
    jcts: dict[str, dict[str, float]],
    *,
    logs: dict[str, list[dict[str, Any]]] | None = None,
    policy: str = "pollux",
    mode: str = "faithful",
    load: str | None = "1.0",
    interval: float = 60,
) -> Path:
    """A run directory with run.json, summary.json and the given logs."""
    root.mkdir(parents=True)
    info = {
        "policy": policy,
        "mode": mode,
        "load": load,
        "interval": interval,
        "interference": 0.0,
        "seed": 0,
        "nodes": 1,
        "gpus_per_node": 4,
        "workloads": list(jcts),
        "wall_seconds": 1.0,
    }
    avgs = {w: sum(j.values()) / len(j) for w, j in jcts.items()}
    summary = {"jcts": jcts, "avgs": avgs, "mean": sum(avgs.values()) / len(avgs)}
    (root / "run.json").write_text(json.dumps(info))
    (root / "summary.json").write_text(json.dumps(summary))
    for workload, records in (logs or {}).items():
        (root / f"{workload}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def only_workload(root: Path) -> WorkloadMetrics:
    """The metrics of the single workload of the run in `root`."""
    (summary,) = summarize_runs([load_run(root)])
    (metrics,) = summary.workloads
    return metrics


def summary(
    policy: str, load: float | None, mean: float, *, mode: str = "faithful", p99: float = 0.0
) -> RunSummary:
    """A one-workload run summary without log-based figures."""
    metrics = WorkloadMetrics("workload-1", 2, mean, p99, None, None, None)
    return RunSummary(policy, mode, load, (metrics,))


def table_rows(text: str) -> list[dict[str, str]]:
    """The body rows of a compare table, keyed by header (cells are split on 2+ spaces)."""
    header, _rule, *body, _note = text.splitlines()
    names = re.split(r"\s{2,}", header)
    return [dict(zip(names, re.split(r"\s{2,}", line.strip()), strict=True)) for line in body]


# --- Metrics -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jcts", "want_mean", "want_p99"),
    [
        pytest.param([42], 42.0, 42.0, id="one job is its own mean and p99"),
        pytest.param([100, 200, 300, 400], 250.0, 397.0, id="p99 interpolates the top two"),
        pytest.param(list(range(1, 101)), 50.5, 99.01, id="p99 of 1..100 is 99.01"),
    ],
)
def test_jct_mean_and_p99(tmp_path, jcts, want_mean, want_p99):
    by_job = {f"job-{i}": float(v) for i, v in enumerate(jcts)}
    assert mean_jct(by_job) == pytest.approx(want_mean)
    assert p99_jct(by_job) == pytest.approx(want_p99)
    metrics = only_workload(write_run(tmp_path / "run", {"workload-1": by_job}))
    assert (metrics.num_jobs, metrics.mean_jct, metrics.p99_jct) == (
        len(jcts),
        pytest.approx(want_mean),
        pytest.approx(want_p99),
    )


def test_makespan_is_the_last_submission_plus_jct_not_the_longest_jct(tmp_path):
    jcts = {"a": 90.0, "b": 100.0, "c": 5.0}
    last = record(
        600, job("a", 0, done=90), job("b", 10, done=110), job("c", 500, done=505), num_gpus=4
    )
    run = write_run(tmp_path / "run", {"workload-1": jcts}, logs={"workload-1": [last]})
    assert only_workload(run).makespan == pytest.approx(505.0)


def test_restarts_per_job_counts_never_allocated_jobs_as_zero(tmp_path):
    jcts = {"a": 10.0, "b": 20.0, "c": 30.0}
    earlier = record(0, job("a", 0, restarts=7))
    last = record(60, job("a", 0, restarts=3), job("b", 0, restarts=None), job("c", 0, restarts=1))
    run = write_run(tmp_path / "run", {"workload-1": jcts}, logs={"workload-1": [earlier, last]})
    assert only_workload(run).restarts_per_job == pytest.approx(4 / 3)


@pytest.mark.parametrize(
    ("jcts", "records", "want"),
    [
        pytest.param(
            {"a": 90.0, "b": 100.0},
            [
                record(0, job("a", 0, gpus=2)),
                record(60, job("a", 0, gpus=2), job("b", 10, gpus=1)),
            ],
            # span 0..110 s; 2 GPUs × 60 s, then 3 GPUs × 50 s (cut at the last completion)
            (2 * 60 + 3 * 50) / (4 * 110),
            id="two rounds, the last cut at the last completion",
        ),
        pytest.param(
            {"a": 30.0, "b": 150.0},
            [
                record(0, job("a", 0, gpus=2), job("b", 0, gpus=1)),
                record(60, job("a", 0, gpus=2, done=30), job("b", 0, gpus=1)),
                record(120, job("a", 0, gpus=2, done=30), job("b", 0, gpus=1)),
            ],
            # a's stale allocation after it completed holds no GPU: 3×60 + 1×60 + 1×30 of 4×150
            (3 * 60 + 1 * 60 + 1 * 30) / (4 * 150),
            id="a completed job's leftover allocation is not counted",
        ),
    ],
)
def test_gpu_utilisation(tmp_path, jcts, records, want):
    run = write_run(tmp_path / "run", {"workload-1": jcts}, logs={"workload-1": records})
    assert only_workload(run).gpu_utilisation == pytest.approx(want)


def test_without_a_log_only_jct_figures_are_known(tmp_path):
    metrics = only_workload(write_run(tmp_path / "run", {"workload-1": {"a": 10.0}}))
    assert metrics.mean_jct == 10.0
    assert (metrics.makespan, metrics.restarts_per_job, metrics.gpu_utilisation) == (
        None,
        None,
        None,
    )


def test_a_run_level_log_figure_needs_every_workload_logged(tmp_path):
    jcts = {"workload-1": {"a": 10.0}, "workload-2": {"a": 30.0}}
    logs = {"workload-1": [record(0, job("a", 0, gpus=1, restarts=0))]}
    (run,) = summarize_runs([load_run(write_run(tmp_path / "run", jcts, logs=logs))])
    assert run.mean_jct == pytest.approx(20.0)
    assert run.makespan is None
    assert run.workloads[0].makespan == pytest.approx(10.0)


def test_runs_with_the_same_policy_mode_and_load_are_pooled(tmp_path):
    first = write_run(tmp_path / "seed-0", {"workload-1": {"a": 100.0}})
    second = write_run(tmp_path / "seed-1", {"workload-1": {"a": 300.0}})
    other = write_run(tmp_path / "tiresias", {"workload-1": {"a": 50.0}}, policy="tiresias")
    runs = summarize_runs(load_run(d) for d in (first, second, other))
    assert [(r.policy, len(r.workloads), r.mean_jct) for r in runs] == [
        ("pollux", 2, pytest.approx(200.0)),
        ("tiresias", 1, pytest.approx(50.0)),
    ]


# --- Published reference ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "load", "want_mean"),
    [
        pytest.param("pollux", 1.0, 2751.1, id="pollux at 1.0x"),
        pytest.param("tiresias", 1.0, 4038.2, id="tiresias at 1.0x"),
        pytest.param("optimus", 0.5, 2395.4, id="optimus at 0.5x"),
    ],
)
def test_published_reference_means_match_the_paper(policy, load, want_mean):
    reference = load_reference(PAPER)
    assert reference[policy, load].mean_jct == pytest.approx(want_mean, abs=0.1)


def test_published_reference_has_every_policy_and_load_and_a_p99():
    reference = load_reference(PAPER)
    assert set(reference) == {
        (p, load) for p in ("pollux", "optimus", "tiresias") for load in (0.5, 1.0, 1.5)
    }
    # Mean over the 8 workloads of each workload's p99 JCT.
    assert reference["pollux", 1.0].p99_jct == pytest.approx(40888.0, abs=0.1)
    assert all(r.p99_jct > r.mean_jct for r in reference.values())


def test_reference_ignores_other_files_but_needs_at_least_one(tmp_path):
    (tmp_path / "README.md").write_text("notes")
    with pytest.raises(ReportError, match=re.escape("no <policy>-<load>.json files")) as err:
        load_reference(tmp_path)
    assert err.value.path == tmp_path


# --- Table -------------------------------------------------------------------------------------


def test_ratio_columns_divide_ours_by_the_reference():
    reference = load_reference(PAPER)
    ours = summary("pollux", 1.0, 2 * 2751.13359375, p99=40887.9975)
    (row,) = table_rows(compare_table([ours], reference))
    assert row["ref mean JCT (s)"] == "2751.1"
    assert row["JCT ratio"] == "2.000"
    assert row["p99 ratio"] == "1.000"


def test_table_has_every_run_sorted_by_load_then_policy():
    runs = [
        summary("tiresias", 1.0, 4000.0),
        summary("pollux", 1.5, 3600.0),
        summary("pollux", 1.0, 2700.0, mode="improved"),
        summary("pollux", 1.0, 2800.0),
        summary("pollux", None, 999.0),
    ]
    rows = table_rows(compare_table(runs, load_reference(PAPER)))
    assert [(r["policy"], r["mode"], r["load"]) for r in rows] == [
        ("pollux", "faithful", "1.0"),
        ("pollux", "improved", "1.0"),
        ("tiresias", "faithful", "1.0"),
        ("pollux", "faithful", "1.5"),
        ("pollux", "faithful", "-"),
    ]


def test_table_prints_missing_values_as_dashes_in_aligned_columns():
    text = compare_table([summary("pollux", 2.0, 5000.0)], {})
    (row,) = table_rows(text)
    assert row["mean JCT (s)"] == "5000.0"
    assert row["GPU util (%)"] == row["ref mean JCT (s)"] == row["JCT ratio"] == "-"
    header, rule, body, _note = text.splitlines()
    # The last column is right-aligned, so every aligned line ends at the same column.
    assert len(header) == len(rule) == len(body)


# --- Plot --------------------------------------------------------------------------------------


def test_plot_writes_a_png(tmp_path):
    runs = [summary("pollux", 0.5, 1600.0), summary("pollux", 1.0, 2800.0)]
    path = tmp_path / "jct.png"
    plot_jct_vs_load(runs, load_reference(PAPER), path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ReportError, match=re.escape("install pollux[sim]")):
        plot_jct_vs_load([summary("pollux", 1.0, 1.0)], {}, tmp_path / "jct.png")


# --- compare_main ------------------------------------------------------------------------------


def test_compare_main_tabulates_runs_against_the_paper_and_plots(tmp_path):
    dirs = [
        write_run(tmp_path / "pollux", {"workload-1": {"a": 2751.1}}),
        write_run(tmp_path / "tiresias", {"workload-1": {"a": 4038.2}}, policy="tiresias"),
    ]
    plot = tmp_path / "jct.png"
    text = compare_main(dirs, PAPER, plot)
    rows = table_rows(text.removesuffix(f"\nplot written to {plot}"))
    assert [(r["policy"], r["JCT ratio"]) for r in rows] == [
        ("pollux", "1.000"),
        ("tiresias", "1.000"),
    ]
    assert plot.stat().st_size > 0


def test_compare_main_needs_a_run():
    with pytest.raises(ReportError, match="no run directories"):
        compare_main([], None, None)


# --- Malformed input ---------------------------------------------------------------------------

RUN_JSON_BREAKAGES = {
    "is not JSON": lambda info: "{policy: pollux",
    "is not an object": lambda info: "[]",
    "lacks the policy": lambda info: {k: v for k, v in info.items() if k != "policy"},
    "has a non-numeric load": lambda info: {**info, "load": "heavy"},
    "has a zero interval": lambda info: {**info, "interval": 0},
    "lists no workloads": lambda info: {**info, "workloads": []},
}


@pytest.mark.parametrize("breakage", RUN_JSON_BREAKAGES.values(), ids=RUN_JSON_BREAKAGES.keys())
def test_malformed_run_json_is_a_report_error_naming_the_file(tmp_path, breakage):
    root = write_run(tmp_path / "run", {"workload-1": {"a": 1.0}})
    broken = breakage(json.loads((root / "run.json").read_text()))
    (root / "run.json").write_text(broken if isinstance(broken, str) else json.dumps(broken))
    with pytest.raises(ReportError, match=re.escape("run.json")) as err:
        load_run(root)
    assert err.value.path == root / "run.json"


def test_missing_run_json_is_a_report_error_naming_the_file(tmp_path):
    root = write_run(tmp_path / "run", {"workload-1": {"a": 1.0}})
    (root / "run.json").unlink()
    with pytest.raises(ReportError, match=r"run\.json: file not found"):
        load_run(root)


@pytest.mark.parametrize(
    ("summary_json", "want"),
    [
        pytest.param({"avgs": {}}, "missing field 'jcts'", id="no jcts"),
        pytest.param(
            {"jcts": {"workload-1": {"a": "slow"}}}, "must be a finite number", id="text JCT"
        ),
        pytest.param({"jcts": {"workload-1": {}}}, "has no jobs", id="a workload without jobs"),
        pytest.param({"jcts": {"workload-9": {"a": 1}}}, "differ from run.json", id="workloads"),
    ],
)
def test_malformed_summary_json_is_a_report_error_naming_the_file(tmp_path, summary_json, want):
    root = write_run(tmp_path / "run", {"workload-1": {"a": 1.0}})
    (root / "summary.json").write_text(json.dumps(summary_json))
    with pytest.raises(ReportError, match=re.escape(want)) as err:
        load_run(root)
    assert err.value.path == root / "summary.json"


@pytest.mark.parametrize(
    ("lines", "want"),
    [
        pytest.param([json.dumps(record(0, job("a", 0))), "{"], "line 2: invalid JSON", id="json"),
        pytest.param(
            [json.dumps({"timestamp": 0, "submitted_jobs": []})],
            "line 1: missing field 'num_gpus'",
            id="no num_gpus",
        ),
        pytest.param(
            [json.dumps(record(0, {**job("a", 0), "allocation": 3}))],
            "'allocation' must be an array",
            id="allocation not a list",
        ),
        pytest.param(
            [json.dumps(record(0, job("other", 0)))],
            "lacks 1 job",
            id="last record lacks a job",
        ),
        pytest.param([""], "no records", id="empty"),
    ],
)
def test_malformed_log_is_a_report_error_naming_the_file(tmp_path, lines, want):
    root = write_run(tmp_path / "run", {"workload-1": {"a": 1.0}})
    (root / "workload-1.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportError, match=re.escape(want)) as err:
        load_run(root)
    assert err.value.path == root / "workload-1.jsonl"
