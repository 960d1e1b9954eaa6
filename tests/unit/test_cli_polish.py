"""pollux-cli's user-facing polish: addresses, --version, plurals, job-file errors, flag names.

Every test runs the real parser, the real job-file reader or the real renderers; commands run
against a fake client (`main(connect=...)`) or fail before any connection is made.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from pollux.client import cli
from pollux.client import format as fmt
from pollux.client._convert import spec_to_proto
from pollux.client.client import Client
from pollux.client.config import (
    Context,
    ServerAddressError,
    parse_servers,
    resolve,
    write_context,
)
from pollux.client.errors import InvalidArgumentError, JobSpecError, UnreachableError
from pollux.client.types import (
    SPEC_KEYS,
    Allocation,
    BatchChoice,
    BatchConfig,
    Explanation,
    Holder,
    Job,
    JobDecision,
    JobEstimate,
    JobSpec,
    ModelSummary,
    Mount,
    read_job_file,
)
from pollux.scheduler.validation import validate_submit
from pollux.service.errors import InvalidArgument

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the user's own config file and POLLUX_* variables out of every test."""
    for name in ("POLLUX_SERVER", "POLLUX_CONTEXT", "POLLUX_CA", "POLLUX_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POLLUX_CONFIG", str(tmp_path / "config.toml"))


# ---- 1. addresses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:7070", ("127.0.0.1:7070",)),
        (" a:1, b:2,a:1 ,", ("a:1", "b:2")),
        ("[::1]:7070", ("[::1]:7070",)),
        (
            "sched-0.pollux.svc:7070,[fe80::1%eth0]:1",
            ("sched-0.pollux.svc:7070", "[fe80::1%eth0]:1"),
        ),
        ("h:0065535", ("h:65535",)),
    ],
)
def test_addresses_that_parse(text: str, want: tuple[str, ...]) -> None:
    assert parse_servers(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("localhost", "localhost has no port: write localhost:7070"),
        ("a:1,localhost", "localhost has no port: write localhost:7070"),
        ("[::1]", "[::1] has no port: write [::1]:7070"),
        ("::1", "put an IPv6 address in brackets and the port after them, e.g. [::1]:7070"),
        ("a:0", "'a:0': port '0' is not a number from 1 to 65535"),
        ("a:65536", "port '65536' is not a number from 1 to 65535"),
        ("a:http", "port 'http' is not a number from 1 to 65535"),
        ("a:", "port '' is not a number from 1 to 65535"),
        (":7070", "':7070' has no host: write e.g. 127.0.0.1:7070"),
        ("http://a:1", "'http://a:1' has a scheme: write host:port only, e.g. a:1"),
        ("dns:///a:1", "write host:port only, e.g. a:1"),
        ("my host:1", "'my host' is not a host name or IPv4 address"),
        ("[zz]:1", "'zz' is not an IPv6 address"),
        (" , ", "at least one scheduler address (host:port) is required"),
    ],
)
def test_addresses_that_do_not_parse_say_what_to_write(text: str, want: str) -> None:
    with pytest.raises(ServerAddressError) as caught:
        parse_servers(text)
    assert want in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_every_bad_address_is_named_at_once() -> None:
    with pytest.raises(ServerAddressError) as caught:
        parse_servers("localhost,ok:1,b:99999")
    assert str(caught.value) == (
        "localhost has no port: write localhost:7070; "
        "'b:99999': port '99999' is not a number from 1 to 65535"
    )


def test_the_client_refuses_an_address_without_a_port() -> None:
    with pytest.raises(ValueError, match="localhost has no port: write localhost:7070"):
        Client("localhost")
    with Client(["[::1]:7070", "b:1"]) as client:
        assert client.targets == ("[::1]:7070", "b:1")


def never_connect(args: argparse.Namespace) -> Any:
    raise AssertionError("a bad address must be refused before connecting")


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [
        (
            ["--server", "localhost"],
            {},
            "error: --server: localhost has no port: write localhost:7070",
        ),
        (
            [],
            {"POLLUX_SERVER": "sched:99999"},
            "error: POLLUX_SERVER: 'sched:99999': port '99999' is not a number from 1 to 65535",
        ),
    ],
    ids=["flag", "environment"],
)
def test_the_cli_says_where_a_bad_address_came_from(
    argv: list[str], env: dict[str, str], want: str, monkeypatch, capsys
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main([*argv, "ls"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [want]


def test_a_bad_address_in_a_context_names_the_context(tmp_path: Path, capsys) -> None:
    write_context(tmp_path / "config.toml", "lab", Context("localhost"))
    assert cli.main(["nodes"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: the server of context 'lab' in {tmp_path / 'config.toml'}: ")
    assert err.rstrip().endswith("localhost has no port: write localhost:7070")


def test_resolve_records_where_the_server_came_from(tmp_path: Path) -> None:
    env = {"POLLUX_CONFIG": str(tmp_path / "config.toml")}
    assert resolve(env).server_from == "the default address"
    write_context(tmp_path / "config.toml", "lab", Context("s:1"))
    assert resolve(env).server_from.startswith("the server of context 'lab'")
    assert resolve({**env, "POLLUX_SERVER": "e:1"}).server_from == "POLLUX_SERVER"
    assert resolve({**env, "POLLUX_SERVER": "e:1"}, server="f:1").server_from == "--server"


# ---- 2. no scheduler: the message (the real connections are tests/integration) -----------------


@pytest.mark.parametrize(
    ("server_from", "cause", "want_note"),
    [
        ("the default address", "connection refused", "(the default address; connection refused)"),
        ("--server", "", "(from --server)"),
        (
            "the server of context 'lab' in /c.toml",
            "",
            "(from the server of context 'lab' in /c.toml)",
        ),
        (None, "", ""),
    ],
)
def test_no_scheduler_message_says_where_and_what_to_do(
    server_from: str | None, cause: str, want_note: str
) -> None:
    error = UnreachableError("grpc said so", targets=("127.0.0.1:7070",), cause=cause)
    text = cli.unreachable_message(error, server_from)
    note = f" {want_note}" if want_note else ""
    assert text == (
        f"no scheduler at 127.0.0.1:7070{note}: start one with ./scripts/demo or set "
        "POLLUX_SERVER (or --server, or a context in ~/.config/pollux/config.toml)"
    )


# ---- 3. --version ----------------------------------------------------------------------------


def test_version_prints_the_installed_version_and_exits_0(capsys) -> None:
    assert cli.main(["--version"], connect=never_connect) == 0
    assert capsys.readouterr().out == f"pollux-cli {metadata.version('pollux-client')}\n"


# ---- 5. plurals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ((1, "GPU"), "1 GPU"),
        ((2, "GPU"), "2 GPUs"),
        ((0, "job"), "0 jobs"),
        ((1, "micro-batch", "micro-batches"), "1 micro-batch"),
        ((3, "micro-batch", "micro-batches"), "3 micro-batches"),
    ],
)
def test_plural(args: tuple[Any, ...], want: str) -> None:
    assert fmt.plural(*args) == want


def a_job(nodes: tuple[str, ...]) -> Job:
    return Job(
        id="j-1",
        spec=JobSpec("train", ("python", "t.py"), 64),
        request_id="r",
        state="RUNNING" if nodes else "PENDING",
        history=(),
        create_time=T0,
        finish_time=None,
        cancel_requested=False,
        restarts=1,
        failures=0,
        allocation=Allocation(nodes, 1, T0, 2) if nodes else None,
    )


def test_one_of_everything_is_singular() -> None:
    model = ModelSummary("agent-0", 1, 1, None, 0.0, 0.0, 64, 64, 1, 64, T0)
    explanation = Explanation(
        a_job(()),
        JobDecision("j-1", ("n1",), 1.0, 1.0, "fair share", True),
        None,
        model,
        BatchConfig(64, 1, 64, 1.0),
        holders=(Holder("j-2", 1, 1.0, 0.0),),
        batch_choice=BatchChoice(64, 64, 0, 10.0, 1.0, 10.0),
        queue_position=1,
        pending_jobs=1,
    )
    text = fmt.explanation_text(explanation)
    for want in (
        "Chosen:           1 GPU on n1\n",
        "64 per GPU × 1 step = total 64",
        "from 1 observation, profiled up to 1 replica,",
        "1st of 1 pending job (by submission time)",
        "(64 per GPU × 1 micro-batch)",
        "j-2's last of 1 GPU is worth",
    ):
        assert want in text, text
    assert fmt.allocation_text(Allocation(("n1",), 1, T0, 2)).startswith("1 GPU on n1 ")
    estimate = fmt.estimate_text(JobEstimate(60.0, T0, "j-0", 10.0, 1), T0)
    assert "1 round of the policy" in estimate


def test_more_than_one_is_plural() -> None:
    from pollux.client.types import Alternative

    job = a_job(("n1", "n2"))
    explanation = Explanation(
        job,
        JobDecision("j-1", ("n1", "n2"), 1.0, 1.0, "", False),
        None,
        ModelSummary("agent-0", 5, 2, None, 0.0, 0.0, 64, 64, 1, 64, T0),
        BatchConfig(64, 2, 256, 1.0),
        alternatives=(Alternative(2, 2, 1.0, 0.0), Alternative(3, 2, 1.2, 0.0)),
        batch_choice=BatchChoice(256, 64, 1, 10.0, 1.0, 10.0),
        queue_position=2,
        pending_jobs=3,
    )
    text = fmt.explanation_text(explanation)
    for want in (
        "2 GPUs on n1, n2",
        "× 2 steps = total 256",
        "from 5 observations, profiled up to 2 replicas,",
        "2nd of 3 pending jobs",
        "2 micro-batches",
        "(2 → 3 GPUs)",
    ):
        assert want in text, text


def test_one_more_gpu_from_none_is_one_gpu() -> None:
    from pollux.client.types import Alternative

    explanation = Explanation(
        a_job(()),
        None,
        None,
        None,
        None,
        alternatives=(Alternative(0, 0, 0.0, 0.0), Alternative(1, 1, 0.5, 0.0)),
    )
    assert "(0 → 1 GPU)" in fmt.explanation_text(explanation)


# ---- 6. a job file's mistakes, all at once ---------------------------------------------------

MANY_MISTAKES = """\
name: Bad_Name
command: [python, train.py]
initial-batch-size: 64
batch_size: 64
max_batch_size: 32
max_replicas: four
stop_grace_s: 7200
scaling_rule: cubic
env: {POLLUX_RANK: "1", DEBUG: true, OK: "1"}
labels: {"team name": vision}
mounts: ["/data:/data"]
"""


def test_a_job_file_reports_every_mistake_at_once(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANY_MISTAKES)
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping(read_job_file(path))
    problems = dict(caught.value.violations)
    assert problems["initial-batch-size"].startswith(
        "unknown key (did you mean 'initial_batch_size'?)"
    )
    assert problems["batch_size"].startswith("unknown key (did you mean 'initial_batch_size'?)")
    assert problems["initial_batch_size"] == "required key is missing"
    assert problems["name"] == (
        "'Bad_Name' must be 1-63 characters of [a-z0-9-] starting with a letter"
    )
    assert problems["max_replicas"] == "expected a whole number, got str 'four'"
    assert problems["stop_grace_s"] == "must be at most 3600"
    assert problems["scaling_rule"].startswith("'cubic' is not one of adascale")
    assert problems["env.POLLUX_RANK"] == "POLLUX_* variables are set by the launcher; rename it"
    assert problems["env.DEBUG"].startswith("expected a string, got bool")
    assert problems["labels.'team name'"].startswith("label keys must be 1-63 characters")
    assert problems["mounts"] == "only applies to a container: set image too, or leave it unset"
    assert "env.OK" not in problems
    # max_batch_size cannot be compared with a missing initial_batch_size: no guess.
    assert "max_batch_size" not in problems


def test_the_cli_prints_every_mistake_in_one_error(tmp_path: Path, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANY_MISTAKES)
    assert cli.main(["submit", "-f", str(path)], connect=lambda args: FakeClient()) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: invalid job spec (")
    assert sorted(line.split(": ", 1)[0].strip() for line in err[1:]) == sorted(
        [
            "initial-batch-size",
            "batch_size",
            "initial_batch_size",
            "name",
            "max_replicas",
            "scaling_rule",
            "env.DEBUG",
            "stop_grace_s",
            "env.POLLUX_RANK",
            "labels.'team name'",
            "mounts",
        ]
    )
    assert "  name: 'Bad_Name' must be 1-63 characters of [a-z0-9-] starting with a letter" in err


@pytest.mark.parametrize(
    ("changes", "key", "want"),
    [
        ({"initial_batch_size": 0}, "initial_batch_size", "must be 1 to 16777216"),
        ({"max_batch_size": 4}, "max_batch_size", "4 is below initial_batch_size 8"),
        (
            {"min_local_batch_size": 8, "max_local_batch_size": 4},
            "min_local_batch_size",
            "8 exceeds max_local_batch_size 4",
        ),
        ({"min_local_batch_size": 16}, "min_local_batch_size", "16 exceeds the largest total"),
        ({"max_failures": 1001}, "max_failures", "must be at most 1000"),
        ({"command": [""]}, "command[0]", "the program must not be empty"),
        ({"env": {"1X": "a"}}, "env.1X", "not a valid environment variable name"),
        (
            {"env": {"A": "1"}, "secret_env": {"A": "2"}},
            "secret_env.A",
            "also in env; keep it in one of them",
        ),
        ({"image": "Ubuntu"}, "image", "'Ubuntu' is not an image reference"),
        ({"shm_size_mb": 64}, "shm_size_mb", "only applies to a container"),
        (
            {"image": "ubuntu", "mounts": ["relative:/d"]},
            "mounts[0].host_path",
            "must be an absolute path",
        ),
        ({"image": "ubuntu", "mounts": ["/a:/"]}, "mounts[0].container_path", "container's root"),
        (
            {"image": "ubuntu", "mounts": ["/a:/d", "/b:/d"]},
            "mounts[1].container_path",
            "mounted twice",
        ),
        ({"image": "ubuntu", "mounts": ["/a/../b:/d"]}, "mounts[0].host_path", "'..' components"),
        ({"batch": {"initial_batch_size": 8}}, "batch", "write the batch limits at the top level"),
        ({"workdir": "/w"}, "workdir", "did you mean 'working_dir'?"),
    ],
)
def test_values_the_server_would_refuse_are_refused_here(
    changes: dict[str, Any], key: str, want: str
) -> None:
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping({"name": "job", "command": ["x"], "initial_batch_size": 8, **changes})
    problems = dict(caught.value.violations)
    assert key in problems, problems
    assert want in problems[key]


SERVER_REFUSES = [
    {"name": "Bad"},
    # Not {"initial_batch_size": 0}: the server then also says min_local_batch_size 1 exceeds
    # the largest total batch 0, which fixing initial_batch_size fixes; the client says it once.
    {"max_batch_size": 4},
    {"min_local_batch_size": 9, "max_local_batch_size": 4, "max_batch_size": 16},
    {"max_replicas": 5000, "max_failures": 2000, "stop_grace_s": 4000},
    {"command": ("",)},
    {"env": {"POLLUX_X": "1", "9": "a"}, "labels": {"a b": "c", "ok": "x" * 300}},
    {"env": {"A": "1"}, "secret_env": {"A": "2"}},
    {"image": "Not An Image", "shm_size_mb": (1 << 20) + 1},
    {"mounts": (Mount("/a", "/b"),)},
    {"shm_size_mb": 64},
    {"image": "u", "mounts": (Mount("rel", "/"), Mount("/a/./b", "/d"), Mount("/c", "/d"))},
]


@pytest.mark.parametrize("changes", SERVER_REFUSES)
def test_the_client_finds_every_field_the_server_refuses(changes: dict[str, Any]) -> None:
    """The client's value checks cover the scheduler's validation (services/scheduler)."""
    fields = {"name": "job", "command": ("x",), "initial_batch_size": 8, **changes}
    with pytest.raises(InvalidArgument) as server:
        validate_submit(spec_to_proto(JobSpec(**fields)), "req-1", has_spec=True)
    with pytest.raises(JobSpecError) as client:
        JobSpec.from_mapping({k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()})
    server_keys = {cli.file_key_path(f) for f, _ in server.value.violations}
    client_keys = {f for f, _ in client.value.violations}
    assert server_keys <= client_keys, (server.value.violations, client.value.violations)


# ---- 7. one name per setting -----------------------------------------------------------------


def test_every_spec_flag_is_its_file_key_with_dashes() -> None:
    parser = cli.build_parser({})
    submit = parser._subparsers._group_actions[0].choices["submit"]  # type: ignore[union-attr]
    flags = {s for a in submit._actions for s in a.option_strings if a.help != argparse.SUPPRESS}
    for spec_flag in cli._SPEC_FLAGS:
        assert spec_flag.key in SPEC_KEYS
        assert spec_flag.flag == "--" + spec_flag.key.replace("_", "-")
        assert spec_flag.flag in flags
        assert not spec_flag.old_flag or spec_flag.old_flag not in flags, "old names are hidden"
    assert "--initial-batch-size" in flags
    assert "--batch-size" not in submit.format_help()


def test_the_new_flags_set_the_file_keys(tmp_path: Path) -> None:
    args = cli.build_parser({}).parse_args(
        [
            "submit",
            "--name",
            "a",
            "--initial-batch-size",
            "32",
            "--stop-grace-s",
            "90",
            "--working-dir",
            "/w",
            "--image",
            "ubuntu",
            "--shm-size-mb",
            "256",
            "--",
            "x",
        ]
    )
    spec = cli.spec_from_args(args)
    assert (spec.initial_batch_size, spec.stop_grace_s, spec.working_dir) == (32, 90, "/w")
    assert spec.shm_size_mb == 256


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("--batch-size", "--initial-batch-size", "32"),
        ("--stop-grace", "--stop-grace-s", "9"),
        ("--workdir", "--working-dir", "/w"),
        ("--shm-size", "--shm-size-mb", "64"),
    ],
)
def test_an_old_flag_still_works_and_says_its_new_name_once(
    old: str, new: str, value: str, capsys
) -> None:
    args = cli.build_parser({}).parse_args(["submit", old, value])
    new_args = cli.build_parser({}).parse_args(["submit", new, value])
    key = new.removeprefix("--").replace("-", "_")
    assert getattr(args, key) == getattr(new_args, key)
    err = capsys.readouterr().err
    assert err == f"pollux-cli: warning: {old} is deprecated; use {new}\n"


@pytest.mark.parametrize(
    ("api", "want"),
    [
        ("spec.batch.initial_batch_size", "initial_batch_size"),
        ("spec.batch.max_local_batch_size", "max_local_batch_size"),
        ("spec.name", "name"),
        ("spec.env[POLLUX_X]", "env.POLLUX_X"),
        ("spec.labels[a/b]", "labels.a/b"),
        ("spec.mounts[0].host_path", "mounts[0].host_path"),
        ("spec.command[0]", "command[0]"),
        ("request_id", "request_id"),
        ("spec", "spec"),
    ],
)
def test_api_field_paths_become_file_keys(api: str, want: str) -> None:
    assert cli.file_key_path(api) == want


class FakeClient:
    """Fails every call with `error` (or, without one, the test did not expect a call)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, spec: JobSpec, *, request_id: str | None = None) -> Job:
        raise self.error or AssertionError("an invalid spec must not be submitted")

    def get_job(self, job_id: str) -> Job:
        raise self.error or AssertionError("unexpected call")


SERVER_ERROR = InvalidArgumentError(
    "invalid request: spec.batch.initial_batch_size: must be >= 1; "
    "spec.shm_size_mb: only applies to a container: set spec.image too, or leave it unset",
    violations=[
        ("spec.batch.initial_batch_size", "must be >= 1"),
        ("spec.shm_size_mb", "only applies to a container: set spec.image too, or leave it unset"),
    ],
)


def test_submit_errors_name_the_file_keys(capsys) -> None:
    argv = ["submit", "--name", "a", "--initial-batch-size", "8", "--", "x"]
    assert cli.main(argv, connect=lambda args: FakeClient(SERVER_ERROR)) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: invalid request",
        "  initial_batch_size: must be >= 1",
        "  shm_size_mb: only applies to a container: set image too, or leave it unset",
    ]


def test_other_commands_keep_the_api_field_paths(capsys) -> None:
    assert cli.main(["describe", "j-1"], connect=lambda args: FakeClient(SERVER_ERROR)) == 1
    assert "  spec.batch.initial_batch_size: must be >= 1" in capsys.readouterr().err
