"""Job files: the same spec from YAML, JSON or TOML, and an error naming every bad key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollux.client.errors import InvalidArgumentError, JobSpecError
from pollux.client.types import JobSpec, Mount, read_job_file

WANT = JobSpec(
    name="cifar",
    command=("python", "train.py", "--epochs", "30"),
    initial_batch_size=128,
    env={"NCCL_DEBUG": "WARN", "SEED": "7"},
    working_dir="/data/cifar",
    max_batch_size=4096,
    min_local_batch_size=16,
    max_local_batch_size=512,
    scaling_rule="sqrt",
    max_replicas=16,
    max_failures=5,
    stop_grace_s=60,
    labels={"team": "vision"},
)

YAML = """\
name: cifar
command: [python, train.py, --epochs, "30"]
initial_batch_size: 128
max_batch_size: 4096
min_local_batch_size: 16
max_local_batch_size: 512
scaling_rule: sqrt
max_replicas: 16
max_failures: 5
stop_grace_s: 60
working_dir: /data/cifar
env:
  NCCL_DEBUG: WARN
  SEED: 7
labels:
  team: vision
"""

TOML = """\
name = "cifar"
command = ["python", "train.py", "--epochs", "30"]
initial_batch_size = 128
max_batch_size = 4096
min_local_batch_size = 16
max_local_batch_size = 512
scaling_rule = "sqrt"
max_replicas = 16
max_failures = 5
stop_grace_s = 60
working_dir = "/data/cifar"

[env]
NCCL_DEBUG = "WARN"
SEED = 7

[labels]
team = "vision"
"""

JSON = json.dumps(
    {
        "name": "cifar",
        "command": ["python", "train.py", "--epochs", "30"],
        "initial_batch_size": 128,
        "max_batch_size": 4096,
        "min_local_batch_size": 16,
        "max_local_batch_size": 512,
        "scaling_rule": "sqrt",
        "max_replicas": 16,
        "max_failures": 5,
        "stop_grace_s": 60,
        "working_dir": "/data/cifar",
        "env": {"NCCL_DEBUG": "WARN", "SEED": 7},
        "labels": {"team": "vision"},
    }
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "text"),
    [("job.yaml", YAML), ("job.yml", YAML), ("job.json", JSON), ("job.toml", TOML)],
)
def test_every_format_gives_the_same_spec(tmp_path, name, text):
    assert JobSpec.from_file(write(tmp_path, name, text)) == WANT


def test_a_file_without_a_known_suffix_is_read_as_yaml(tmp_path):
    assert JobSpec.from_file(write(tmp_path, "job", YAML)) == WANT


def test_minimal_spec_takes_the_server_defaults():
    spec = JobSpec.from_mapping({"name": "job", "command": ["true"], "initial_batch_size": 1})
    assert spec == JobSpec("job", ("true",), 1)
    assert spec.scaling_rule == "adascale"
    assert (spec.max_batch_size, spec.max_failures, spec.max_replicas) == (0, 0, 0)


def test_a_command_string_is_split_like_a_shell():
    spec = JobSpec.from_mapping(
        {"name": "job", "command": "python train.py --msg 'hello world'", "initial_batch_size": 1}
    )
    assert spec.command == ("python", "train.py", "--msg", "hello world")


def test_scaling_rule_is_case_insensitive():
    spec = JobSpec.from_mapping(
        {"name": "job", "command": ["x"], "initial_batch_size": 1, "scaling_rule": "AdaScale"}
    )
    assert spec.scaling_rule == "adascale"


def test_spec_copies_its_collections():
    env = {"A": "1"}
    command = ["x"]
    spec = JobSpec("a", command, 1, env=env)  # type: ignore[arg-type]
    env["A"] = "2"
    command.append("y")
    assert spec.env == {"A": "1"}
    assert spec.command == ("x",)
    assert hash(spec) == hash(JobSpec("a", ("x",), 1, env={"B": "2"}))


BASE = {"name": "job", "command": ["x"], "initial_batch_size": 8}


def problems_of(**changes: object) -> dict[str, str]:
    data = {**BASE, **changes}
    data = {k: v for k, v in data.items() if v is not ...}
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping(data)
    return dict(caught.value.violations)


@pytest.mark.parametrize(
    ("changes", "key", "want"),
    [
        ({"name": ...}, "name", "required key is missing"),
        ({"command": ...}, "command", "required key is missing"),
        ({"initial_batch_size": ...}, "initial_batch_size", "required key is missing"),
        ({"name": 3}, "name", "must be a string, got int"),
        ({"working_dir": ["/a"]}, "working_dir", "must be a string, got list"),
        ({"command": [1, 2]}, "command", "must be a list of strings"),
        ({"command": []}, "command", "must name at least the program"),
        ({"command": ""}, "command", "must name at least the program"),
        ({"command": "python 'unclosed"}, "command", "cannot split"),
        ({"command": {"a": 1}}, "command", "must be a list of strings"),
        ({"initial_batch_size": "128"}, "initial_batch_size", "must be a whole number, got str"),
        ({"initial_batch_size": 1.5}, "initial_batch_size", "must be a whole number, got float"),
        ({"max_replicas": True}, "max_replicas", "must be a whole number, got bool"),
        (
            {"max_batch_size": -1},
            "max_batch_size",
            "must be 0 to 16777216 (0: initial_batch_size), not -1",
        ),
        ({"min_local_batch_size": -2}, "min_local_batch_size", "must be 0 to 16777216"),
        ({"max_local_batch_size": "big"}, "max_local_batch_size", "must be a whole number"),
        ({"max_failures": -1}, "max_failures", "must be 0 to 1000 (0: 3), not -1"),
        ({"stop_grace_s": 2.5}, "stop_grace_s", "must be a whole number"),
        ({"scaling_rule": "cubic"}, "scaling_rule", "'cubic' is not one of adascale"),
        (
            {"scaling_rule": 2},
            "scaling_rule",
            "must be one of adascale, linear, sqrt, none, got int 2",
        ),
        ({"env": ["A=1"]}, "env", "must be a mapping"),
        (
            {"env": {"DEBUG": True}},
            "env.DEBUG",
            "must be a string, got bool True (quote the value)",
        ),
        ({"env": {"X": None}}, "env.X", "must be a string, got nothing"),
        ({"env": {1: "a"}}, "env.1", "names must be strings"),
        ({"labels": "team=vision"}, "labels", "must be a mapping"),
        ({"labels": {"team": ["a"]}}, "labels.team", "must be a string, got list"),
        ({"max_batch": 4}, "max_batch", "unknown key (did you mean 'max_batch_size'?)"),
        ({"gpus": 4}, "gpus", "unknown key; known keys: name, command"),
        ({"image": ["ubuntu"]}, "image", "must be a string, got list"),
        ({"shm_size_mb": "1g"}, "shm_size_mb", "must be a whole number, got str"),
        ({"mounts": "/a:/b"}, "mounts", "must be a list of SRC:DST[:ro] entries, got str"),
        ({"mounts": ["/a"]}, "mounts[0]", "'/a' is not SRC:DST[:ro]"),
        ({"mounts": ["/a:/b:rx"]}, "mounts[0]", "is not SRC:DST[:ro]"),
        ({"mounts": ["/a:/b:c:ro"]}, "mounts[0]", "is not SRC:DST[:ro]"),
        ({"mounts": [{"host_path": "/a"}]}, "mounts[0]", "must both be strings"),
        ({"mounts": [{"src": "/a"}]}, "mounts[0]", "unknown keys src"),
        (
            {"mounts": [{"host_path": "/a", "container_path": "/b", "read_only": "yes"}]},
            "mounts[0]",
            "read_only must be true or false, got str",
        ),
        ({"mounts": [3]}, "mounts[0]", "must be SRC:DST[:ro] or a mapping, got int"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_key_is_named_with_the_fix(changes, key, want):
    problems = problems_of(**changes)
    assert key in problems, problems
    assert want in problems[key]


def test_every_problem_is_reported_at_once():
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping({"nme": "a", "command": [], "max_replicas": -1})
    keys = [v.field for v in caught.value.violations]
    assert keys == ["nme", "name", "initial_batch_size", "command", "max_replicas"]
    assert "nme, name, initial_batch_size, command, max_replicas" in str(caught.value)


def test_job_spec_error_is_an_invalid_argument_and_a_value_error():
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping({})
    assert isinstance(caught.value, InvalidArgumentError)
    assert isinstance(caught.value, ValueError)
    assert caught.value.code is None


def test_a_spec_that_is_not_a_mapping_is_refused():
    with pytest.raises(JobSpecError, match="must be a mapping"):
        JobSpec.from_mapping(["name", "a"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "text", "want"),
    [
        ("job.yaml", "name: [unclosed", "cannot parse job file"),
        ("job.json", "{'name': 1}", "cannot parse job file"),
        ("job.toml", "name = ", "cannot parse job file"),
        ("job.yaml", "- a\n- b\n", r"must hold a mapping of spec keys \(got list\)"),
        ("job.json", "42", r"\(got int\)"),
    ],
)
def test_an_unreadable_file_is_a_job_spec_error(tmp_path, name, text, want):
    with pytest.raises(JobSpecError, match=want):
        read_job_file(write(tmp_path, name, text))


def test_a_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(JobSpecError, match=r"cannot read job file .*nope\.yaml"):
        read_job_file(path)


def test_an_empty_file_is_an_empty_mapping(tmp_path):
    assert read_job_file(write(tmp_path, "job.yaml", "")) == {}
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_file(tmp_path / "job.yaml")
    assert {v.field for v in caught.value.violations} == {"name", "command", "initial_batch_size"}


@pytest.mark.parametrize(
    ("working_dir", "want"),
    [
        pytest.param(".", "jobs", id="dot is the file's own directory"),
        pytest.param("../code", "code", id="a relative path is taken from the file"),
        pytest.param("/srv/train", "/srv/train", id="an absolute path is kept"),
    ],
)
def test_a_relative_working_dir_is_relative_to_the_job_file(tmp_path, working_dir, want):
    (tmp_path / "jobs").mkdir()
    path = tmp_path / "jobs" / "job.yaml"
    path.write_text(
        f"name: job\ncommand: [python, t.py]\ninitial_batch_size: 8\nworking_dir: {working_dir}\n"
    )
    spec = JobSpec.from_file(path)
    assert spec.working_dir == (want if want.startswith("/") else str(tmp_path / want))


def test_the_sample_job_file_is_a_valid_spec():
    spec = JobSpec.from_file(Path(__file__).resolve().parents[2] / "examples" / "elastic_job.yaml")
    assert Path(spec.working_dir, spec.command[1]).is_file()
    assert spec.initial_batch_size < spec.max_batch_size


def test_container_keys_from_strings_or_mappings():
    spec = JobSpec.from_mapping(
        {
            "name": "cuda-job",
            "command": "python train.py",
            "initial_batch_size": 8,
            "image": "ghcr.io/org/train:1.2",
            "shm_size_mb": 2048,
            "mounts": [
                "/srv/data:/data:ro",
                "/scratch:/scratch",
                {"host_path": "/a", "container_path": "/b", "read_only": True},
                {"host_path": "/c", "container_path": "/d"},
            ],
        }
    )
    assert (spec.image, spec.shm_size_mb) == ("ghcr.io/org/train:1.2", 2048)
    assert spec.mounts == (
        Mount("/srv/data", "/data", read_only=True),
        Mount("/scratch", "/scratch"),
        Mount("/a", "/b", read_only=True),
        Mount("/c", "/d"),
    )
    assert [str(m) for m in spec.mounts] == [
        "/srv/data:/data:ro",
        "/scratch:/scratch",
        "/a:/b:ro",
        "/c:/d",
    ]
    assert Mount.parse("/x:/y:rw") == Mount("/x", "/y")
