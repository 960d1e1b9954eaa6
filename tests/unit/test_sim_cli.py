"""`pollux-sim run | compare | fit` end to end on real workload files, in-process."""

import json
import shutil
from pathlib import Path

import pytest

from pollux.sim.cli import main
from pollux.sim.traces import default_data_root

WORKLOADS = default_data_root() / "workloads"


def test_run_writes_the_published_summary_format_and_round_logs(tmp_path, capsys):
    out = tmp_path / "tiresias"
    assert (
        main(
            ["run", "--policy", "tiresias", "--output", str(out), str(WORKLOADS / "workload-6.csv")]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"jcts", "avgs", "mean"}
    assert summary["avgs"]["workload-6"] == pytest.approx(3469.69375)
    assert len(summary["jcts"]["workload-6"]) == 160
    info = json.loads((out / "run.json").read_text())
    assert (info["policy"], info["mode"], info["load"]) == ("tiresias", "periodic", "1.0")
    first = json.loads((out / "workload-6.jsonl").open().readline())
    assert {"timestamp", "num_nodes", "num_gpus", "submitted_jobs"} <= set(first)
    assert "mean of workload averages: 3469.7 s" in capsys.readouterr().out


def test_event_rounds_run_a_round_after_each_submission(tmp_path, capsys):
    out = tmp_path / "events"
    workload = WORKLOADS / "workload-6.csv"
    argv = ["run", "--policy", "tiresias", "--event-delay", "1", "--output", str(out)]
    assert main([*argv, str(workload)]) == 0
    assert json.loads((out / "run.json").read_text())["event_delay"] == 1.0
    times = [json.loads(line)["timestamp"] for line in (out / "workload-6.jsonl").open()]
    submitted = [float(line.split(",")[1]) for line in workload.read_text().splitlines()[1:]]
    # Within a second of each submission (sooner when another event's round falls there).
    assert all(any(s <= t <= s + 1.0 for t in times) for s in submitted)


def test_placement_event_rounds_are_selected_and_recorded(tmp_path):
    out = tmp_path / "place"
    # The first 24 jobs of a published workload: enough arrivals for event rounds between
    # the periodic ones, at a tenth of the whole workload's cost.
    workload = tmp_path / "workload-6.csv"
    lines = (WORKLOADS / "workload-6.csv").read_text().splitlines()
    workload.write_text("\n".join(lines[:25]) + "\n")
    argv = ["run", "--event-delay", "1", "--event-rounds", "place", "--output", str(out)]
    assert main([*argv, str(workload)]) == 0
    info = json.loads((out / "run.json").read_text())
    assert (info["event_delay"], info["event_rounds"]) == (1.0, "place")
    times = [json.loads(line)["timestamp"] for line in (out / "workload-6.jsonl").open()]
    assert any(t % 60 for t in times)  # event rounds ran between the periodic ones


def test_a_directory_of_workloads_runs_in_parallel_and_compares(tmp_path, capsys):
    folder = tmp_path / "workloads"
    folder.mkdir()
    for n in (5, 6):
        shutil.copy(WORKLOADS / f"workload-{n}.csv", folder)
    out = tmp_path / "run"
    assert (
        main(["run", "--policy", "tiresias", "--processes", "2", "--output", str(out), str(folder)])
        == 0
    )
    assert set(json.loads((out / "summary.json").read_text())["avgs"]) == {
        "workload-5",
        "workload-6",
    }
    capsys.readouterr()
    plot = tmp_path / "jct.png"
    assert main(["compare", str(out), "--no-reference", "--plot", str(plot)]) == 0
    table = capsys.readouterr().out
    assert "tiresias" in table
    assert plot.read_bytes().startswith(b"\x89PNG")  # load 1.0 inferred from "workloads"
    assert "plot written" in table


def test_compare_against_the_published_results(tmp_path, capsys):
    out = tmp_path / "tiresias-1.0"
    assert (
        main(
            ["run", "--policy", "tiresias", "--output", str(out), str(WORKLOADS / "workload-6.csv")]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["compare", str(out)]) == 0
    table = capsys.readouterr().out
    assert "4038.2" in table  # the published Tiresias mean at 1.0x


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--output", "x", "no/such/file.csv"], "no such workload"),
        (["compare", "no/such/run"], "run.json"),
        (["fit", "no/such/app"], "not a directory"),
        (
            ["run", "--event-delay", "60", "--output", "x", str(WORKLOADS / "workload-6.csv")],
            "event_delay < interval",
        ),
        (
            ["run", "--event-rounds", "place", "--output", "x", str(WORKLOADS / "workload-6.csv")],
            "needs an event_delay",
        ),
    ],
    ids=[
        "missing workload",
        "missing run directory",
        "missing traces",
        "event delay too long",
        "placement rounds without events",
    ],
)
def test_errors_are_one_clear_line_and_exit_code_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("pollux-sim: error:")
    assert err.count("\n") == 1


def test_unknown_policy_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--policy", "fifo", "--output", "x", "y"])
    assert exit_info.value.code == 2


def test_fit_prints_the_model_of_an_application(capsys):
    assert main(["fit", str(default_data_root() / "traces" / "cifar10")]) == 0
    out = capsys.readouterr().out
    assert "cifar10" in out
    assert "alpha_c=" in out
    assert "speedup over one GPU" in out


def test_relative_output_paths_are_fine(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "run",
                "--policy",
                "optimus",
                "--nodes",
                "4",
                "--output",
                "o",
                str(WORKLOADS / "workload-6.csv"),
            ]
        )
        == 0
    )
    assert (tmp_path / "o" / "summary.json").is_file()
