"""pollux-cli: argument parsing, flag-over-file precedence, outputs and exit codes.

Commands run against a fake client (`main(connect=...)`), so no server is needed; the
integration tests drive the same CLI against real gRPC servers.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from pollux.client import cli
from pollux.client.client import LogChunk
from pollux.client.config import resolve
from pollux.client.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from pollux.client.types import (
    Allocation,
    ClusterStatus,
    Explanation,
    Job,
    JobSpec,
    Mount,
    NodeStatus,
)
from pollux.v1 import admin_service_pb2 as apb

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def a_job(job_id: str = "j-1", spec: JobSpec | None = None, state: str = "PENDING") -> Job:
    return Job(
        id=job_id,
        spec=spec or JobSpec("train", ("python", "train.py"), 128),
        request_id="r",
        state=state,
        history=(),
        create_time=T0,
        finish_time=None,
        cancel_requested=False,
        restarts=0,
        failures=0,
        allocation=Allocation(("n1",), 1, T0, 1) if state == "RUNNING" else None,
    )


class FakeClient:
    """Records calls; answers with canned values or raises `error` when set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.error: Exception | None = None
        self.closed = False

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if self.error is not None:
            raise self.error

    def submit(self, spec: JobSpec, *, request_id: str | None = None) -> Job:
        self._record("submit", spec, request_id=request_id)
        return a_job(spec=spec)

    def get_job(self, job_id: str) -> Job:
        self._record("get_job", job_id)
        return a_job(job_id, state="RUNNING")

    def list_jobs(self, **kwargs: Any) -> Any:
        self._record("list_jobs", **kwargs)
        return iter([a_job("j-1"), a_job("j-2", state="RUNNING")])

    def cancel(self, job_id: str, reason: str = "") -> Job:
        self._record("cancel", job_id, reason=reason)
        return a_job(job_id)

    def delete(self, job_id: str) -> None:
        self._record("delete", job_id)

    def explain(self, job_id: str) -> Explanation:
        self._record("explain", job_id)
        return Explanation(a_job(job_id), None, None, None, None)

    def cluster_status(self) -> ClusterStatus:
        self._record("cluster_status")
        node = NodeStatus("n1", "10.0.0.1:7071", 4, "cpu-slot", {}, T0, 1, ("j-2",))
        return ClusterStatus((node,), (), "s-a", "10.0.0.1:7070", 4, 1, {"RUNNING": 1}, 9, "s-a")

    def log_chunks(self, job_id: str, rank: int = 0, **kwargs: Any) -> Any:
        self._record("log_chunks", job_id, rank, **kwargs)
        yield LogChunk(1, ("line one",))
        yield LogChunk(1, ("line two",))

    def whoami(self) -> Any:
        self._record("whoami")
        return apb.WhoAmIResponse(name="alice", role="user")


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


def run(fake: FakeClient, *argv: str) -> int:
    return cli.main(list(argv), connect=lambda args: fake)  # type: ignore[arg-type,return-value]


def parse(*argv: str, environ: dict[str, str] | None = None) -> Any:
    return cli.build_parser(environ or {}).parse_args(list(argv))


# ---- global options --------------------------------------------------------------------------


def test_defaults(tmp_path: Path):
    args = parse("ls")
    assert (args.server, args.context, args.output, args.timeout) == (None, None, "table", 10.0)
    # With no flag, variable or config file, the client dials the local default in plaintext.
    context = resolve({"POLLUX_CONFIG": str(tmp_path / "none.toml")})
    assert (context.server, context.ca_file, context.token) == ("127.0.0.1:7070", None, None)


def test_server_comes_from_the_environment():
    assert parse("ls", environ={"POLLUX_SERVER": "a:1,b:2"}).server == "a:1,b:2"
    assert parse("--server", "c:3", "ls", environ={"POLLUX_SERVER": "a:1"}).server == "c:3"


def test_global_options_work_before_or_after_the_command():
    before = parse("-o", "json", "--timeout", "3", "--server", "x:1", "ls")
    after = parse("ls", "-o", "json", "--timeout", "3", "--server", "x:1")
    for args in (before, after):
        assert (args.output, args.timeout, args.server) == ("json", 3.0, "x:1")
    assert parse("-o", "yaml", "ls").output == "yaml"  # not reset by the subcommand


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["-o", "xml", "ls"],
        ["--timeout", "0", "ls"],
        ["--timeout", "soon", "ls"],
        ["ls", "--state", "sleeping"],
        ["ls", "--label", "novalue"],
        ["describe"],
        ["logs", "j-1", "--rank", "-1"],
        ["logs", "j-1", "--tail", "x"],
        ["submit", "--batch-size", "-5"],
        ["submit", "--env", "=x"],
        ["submit", "--scaling-rule", "cubic"],
        ["submit", "--mount", "/only-one-path"],
        ["submit", "--mount", "/a:/b:rx"],
        ["submit", "--shm-size", "-1"],
        ["top", "--interval", "-1"],
    ],
    ids=lambda argv: " ".join(argv) or "no command",
)
def test_usage_errors_exit_2_without_calling_the_server(fake, argv, capsys):
    assert run(fake, *argv) == 2
    assert fake.calls == []
    assert "usage:" in capsys.readouterr().err


def test_help_exits_0(fake, capsys):
    assert run(fake, "--help") == 0
    assert "submit" in capsys.readouterr().out


def test_empty_server_list_is_a_usage_error(capsys):
    assert cli.main(["--server", " , ", "ls"]) == 2
    assert "at least one scheduler address" in capsys.readouterr().err


# ---- submit: flags over the file -------------------------------------------------------------


JOB_FILE = """\
name: from-file
command: [python, file.py]
initial_batch_size: 64
max_batch_size: 1024
scaling_rule: linear
env: {A: file, B: file}
labels: {team: vision}
"""


def submit_args(tmp_path, *argv: str) -> JobSpec:
    path = tmp_path / "job.yaml"
    path.write_text(JOB_FILE)
    return cli.spec_from_args(parse("submit", "-f", str(path), *argv))


def test_the_file_alone(tmp_path):
    spec = submit_args(tmp_path)
    assert spec == JobSpec(
        "from-file",
        ("python", "file.py"),
        64,
        max_batch_size=1024,
        scaling_rule="linear",
        env={"A": "file", "B": "file"},
        labels={"team": "vision"},
        working_dir=os.getcwd(),  # no working_dir anywhere: where pollux-cli ran
    )


def test_flags_override_the_file(tmp_path):
    spec = submit_args(
        tmp_path,
        "--name",
        "from-flag",
        "--batch-size",
        "32",
        "--max-batch-size",
        "512",
        "--min-local-batch-size",
        "4",
        "--max-local-batch-size",
        "128",
        "--max-replicas",
        "8",
        "--max-failures",
        "2",
        "--stop-grace",
        "90",
        "--scaling-rule",
        "sqrt",
        "--workdir",
        "/w",
    )
    assert (spec.name, spec.initial_batch_size, spec.max_batch_size) == ("from-flag", 32, 512)
    assert (spec.min_local_batch_size, spec.max_local_batch_size) == (4, 128)
    assert (spec.max_replicas, spec.max_failures, spec.stop_grace_s) == (8, 2, 90)
    assert (spec.scaling_rule, spec.working_dir) == ("sqrt", "/w")
    assert spec.command == ("python", "file.py")  # not given: the file's


def test_env_and_labels_merge_key_by_key(tmp_path):
    spec = submit_args(tmp_path, "--env", "B=flag", "--env", "C=x=y", "--label", "tier=gold")
    assert spec.env == {"A": "file", "B": "flag", "C": "x=y"}
    assert spec.labels == {"team": "vision", "tier": "gold"}


def test_container_flags(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "name: cuda-job\ncommand: [python, t.py]\ninitial_batch_size: 8\nmounts: [/srv:/srv:ro]\n"
    )
    args = parse(
        "submit",
        "-f",
        str(tmp_path / "c.yaml"),
        "--image",
        "localhost/train:1",
        "--shm-size",
        "512",
        "--mount",
        "/data:/data",
        "--mount",
        "/ckpt:/in:ro",
    )
    spec = cli.spec_from_args(args)
    assert (spec.image, spec.shm_size_mb) == ("localhost/train:1", 512)
    assert spec.mounts == (  # the file's first, then the flags'
        Mount("/srv", "/srv", read_only=True),
        Mount("/data", "/data"),
        Mount("/ckpt", "/in", read_only=True),
    )


def test_the_command_after_double_dash_replaces_the_file_command(tmp_path):
    spec = submit_args(tmp_path, "--", "python", "flag.py", "--lr", "0.1", "-f", "x")
    assert spec.command == ("python", "flag.py", "--lr", "0.1", "-f", "x")


def test_submit_without_a_file():
    args = parse("submit", "--name", "job", "--batch-size", "16", "--", "python", "t.py")
    want = JobSpec("job", ("python", "t.py"), 16, working_dir=os.getcwd())
    assert cli.spec_from_args(args) == want


def test_submit_calls_the_client_and_prints_the_id(fake, capsys):
    code = run(
        fake, "submit", "--name", "job", "--batch-size", "16", "--request-id", "k1", "--", "t"
    )
    assert code == 0
    name, (spec,), kwargs = fake.calls[0]
    want = JobSpec("job", ("t",), 16, working_dir=os.getcwd())
    assert (name, spec, kwargs) == ("submit", want, {"request_id": "k1"})
    assert capsys.readouterr().out == "j-1\tjob\tPENDING\n"
    assert fake.closed


def test_submit_with_an_incomplete_spec_names_each_missing_key(fake, capsys):
    assert run(fake, "submit", "--name", "job") == 1
    assert fake.calls == []
    assert capsys.readouterr().err.splitlines() == [
        "error: invalid job spec (command, initial_batch_size)",
        "  command: required key is missing",
        "  initial_batch_size: required key is missing",
    ]


def test_submit_with_a_missing_file(fake, tmp_path, capsys):
    assert run(fake, "submit", "-f", str(tmp_path / "nope.yaml")) == 1
    assert capsys.readouterr().err.startswith("error: cannot read job file")


# ---- other commands --------------------------------------------------------------------------


def test_ls_passes_filters(fake, capsys):
    argv = ["--state", "running", "--state", "PENDING", "--name-prefix", "tr", "--label", "team=a"]
    assert run(fake, "ls", *argv, "--limit", "5") == 0
    assert fake.calls == [
        (
            "list_jobs",
            (),
            {
                "states": ["RUNNING", "PENDING"],
                "name_prefix": "tr",
                "labels": {"team": "a"},
                "newest_first": True,
                "owner": "",
                "limit": 6,
            },
        )
    ]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ID")
    assert [line.split()[0] for line in lines[1:]] == ["j-1", "j-2"]


def test_ls_without_filters_asks_for_every_state(fake):
    run(fake, "ls")
    asked = [call[2]["states"] for call in fake.calls if call[0] == "list_jobs"]
    # The active states first (listed before the others), then every job: none left out.
    assert asked == [["PENDING", "ALLOCATED", "RUNNING", "RESCALING"], None]


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_ls_data_outputs_are_lists_of_jobs(fake, capsys, output):
    assert run(fake, "-o", output, "ls") == 0
    text = capsys.readouterr().out
    data = json.loads(text) if output == "json" else yaml.safe_load(text)
    assert [j["id"] for j in data] == ["j-1", "j-2"]
    assert data[1]["allocation"]["nodes"] == ["n1"]


def test_describe(fake, capsys):
    assert run(fake, "describe", "j-7") == 0
    assert fake.calls == [("get_job", ("j-7",), {})]
    assert "Job:           j-7" in capsys.readouterr().out


def test_logs(fake, capsys):
    assert run(fake, "logs", "j-7", "--rank", "2", "--tail", "10") == 0
    assert fake.calls == [("log_chunks", ("j-7", 2), {"tail_lines": 10, "since": None})]
    assert capsys.readouterr().out == "line one\nline two\n"


def test_ls_shows_a_screenful_newest_first_and_says_when_it_left_jobs_out(
    fake, capsys, monkeypatch
):
    monkeypatch.setenv("LINES", "6")  # a screenful is then the minimum, 5 jobs
    monkeypatch.setattr(
        fake,
        "list_jobs",
        lambda **kw: (fake._record("list_jobs", **kw), iter(a_job(f"j-{i}") for i in range(9)))[1],
    )
    assert run(fake, "ls") == 0
    assert fake.calls[0][2]["limit"] == 6
    assert fake.calls[0][2]["newest_first"] is True
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 + 5
    assert "--limit N or --all" in err


def test_ls_all_and_mine(fake, capsys):
    assert run(fake, "ls", "--all", "--mine") == 0
    assert fake.calls[0] == ("whoami", (), {})
    assert fake.calls[1][2]["owner"] == "alice"
    assert fake.calls[1][2]["limit"] is None
    assert capsys.readouterr().err == ""


def test_ls_user_and_mine_exclude_each_other(fake, capsys):
    assert run(fake, "ls", "--mine", "--user", "bob") == 2
    assert fake.calls == []


def test_cancel_with_reason(fake, capsys):
    assert run(fake, "cancel", "j-7", "--reason", "wrong data") == 0
    assert fake.calls == [("cancel", ("j-7",), {"reason": "wrong data"})]
    assert "cancel requested" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("output", "want"),
    [("table", "deleted j-7\n"), ("json", '{\n  "deleted": "j-7"\n}\n')],
)
def test_delete(fake, capsys, output, want):
    assert run(fake, "-o", output, "delete", "j-7") == 0
    assert capsys.readouterr().out == want


def test_explain(fake, capsys):
    assert run(fake, "explain", "j-7") == 0
    assert "Decision:  none yet" in capsys.readouterr().out


def test_nodes(fake, capsys):
    assert run(fake, "nodes") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["n1", "1/4", "3", "cpu-slot", "10.0.0.1:7071", "j-2"]


def test_nodes_json_is_the_node_list(fake, capsys):
    assert run(fake, "-o", "json", "nodes") == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "n1"


def test_top_once(fake, capsys):
    assert run(fake, "top", "--once") == 0
    out = capsys.readouterr().out
    assert out.startswith("leader s-a (10.0.0.1:7070)  round 9")
    assert "\x1b[" not in out  # never clears a screen it does not own
    states = fake.calls[1][2]["states"]
    assert set(states) == {"PENDING", "ALLOCATED", "RUNNING", "RESCALING"}


def test_top_json_frame(fake, capsys):
    assert run(fake, "-o", "json", "top", "--once") == 0
    frame = json.loads(capsys.readouterr().out)
    assert frame["cluster"]["leader_id"] == "s-a"
    assert [j["id"] for j in frame["jobs"]] == ["j-1", "j-2"]


def test_top_refreshes_until_ctrl_c(fake, monkeypatch, capsys):
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", sleep)
    assert run(fake, "top", "--interval", "0.5") == 130
    assert sleeps == [0.5, 0.5]
    captured = capsys.readouterr()
    assert captured.out.count("leader s-a") == 2
    assert captured.err == ""


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (NotFoundError("job j-7 not found"), ["error: job j-7 not found"]),
        (
            FailedPreconditionError("job is RUNNING: cancel it"),
            ["error: job is RUNNING: cancel it"],
        ),
        (UnavailableError("no scheduler could serve it"), ["error: no scheduler could serve it"]),
        (
            InvalidArgumentError(
                "invalid request: spec.name: bad; spec.env[POLLUX_X]: reserved",
                violations=[("spec.name", "bad"), ("spec.env[POLLUX_X]", "reserved")],
            ),
            ["error: invalid request", "  spec.name: bad", "  spec.env[POLLUX_X]: reserved"],
        ),
        (
            InvalidArgumentError("bad page token", violations=[("page_token", "unknown")]),
            ["error: bad page token", "  page_token: unknown"],
        ),
    ],
    ids=["not found", "precondition", "unavailable", "violations", "violations not in message"],
)
def test_errors_print_one_clear_line_and_exit_1(fake, capsys, error, want):
    fake.error = error
    assert run(fake, "describe", "j-7") == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == want
    assert captured.out == ""
    assert fake.closed


def test_ctrl_c_exits_130_quietly(fake, capsys):
    fake.error = KeyboardInterrupt()
    assert run(fake, "ls") == 130
    assert capsys.readouterr().err == ""


def test_version_prints_the_installed_version_and_exits_0(capsys):
    def never_connect(args: object) -> Any:
        raise AssertionError("--version needs no scheduler")

    assert cli.main(["--version"], connect=never_connect) == 0
    assert capsys.readouterr().out == f"pollux-cli {metadata.version('pollux-client')}\n"
