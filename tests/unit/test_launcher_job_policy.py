"""The launcher's job policy: working and checkpoint directories, environment, replica user."""

from __future__ import annotations

import dataclasses
import os
import pwd
import sys
from pathlib import Path

import pytest

from pollux.launcher import exec_as
from pollux.launcher.config import LauncherConfig
from pollux.launcher.job_files import make_private_dir, make_private_subdir, write_file
from pollux.launcher.job_policy import JobPolicy, RunAs, checkpoint_problems
from pollux.launcher.placement import ReplicaPlan, contract_env, replica_env
from pollux.launcher.replica import LaunchSpec, with_launcher_fence
from pollux.launcher.workspaces import GENERATION_FILE, fence_checkpoint_dir
from pollux.service.config import ConfigError, load
from pollux.v1 import types_pb2 as pb

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to change owners)")


def refusal(
    policy: JobPolicy,
    tmp_path: Path,
    *,
    job_id: str = "j-1",
    default_working_dir: Path | None = None,
    launcher_uid: int = 1000,
    **spec: object,
) -> str:
    (tmp_path / "ck").mkdir(exist_ok=True)
    return policy.refusal(
        pb.JobSpec(name="train", command=["true"], **spec),
        job_id=job_id,
        checkpoint_root=tmp_path / "ck",
        default_working_dir=default_working_dir,
        launcher_uid=launcher_uid,
    )


# -- working directory --------------------------------------------------------------------------


def test_a_working_dir_under_an_allowed_root_or_none_at_all_is_fine(tmp_path):
    policy = JobPolicy()
    assert refusal(policy, tmp_path) == ""
    assert refusal(policy, tmp_path, working_dir=str(tmp_path)) == ""
    assert refusal(policy, tmp_path, working_dir="/tmp") == ""
    assert refusal(policy, tmp_path, working_dir="/home/alice/project") == ""


def test_a_working_dir_outside_the_roots_is_refused_saying_what_to_do(tmp_path):
    policy = JobPolicy(allowed_roots=(Path("/srv/jobs"), Path("/tmp")))
    assert refusal(policy, tmp_path, working_dir="/etc") == (
        "working_dir /etc is outside the allowed roots /srv/jobs, /tmp: set "
        "job_policy.allowed_roots on the launcher or use a directory under them"
    )
    assert "/srv/jobsX" in refusal(policy, tmp_path, working_dir="/srv/jobsX")  # not a prefix


def test_dot_dot_and_symlinks_cannot_escape_a_root(tmp_path):
    policy = JobPolicy(allowed_roots=(tmp_path / "jobs",))
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "link").symlink_to("/etc")
    escaped = refusal(policy, tmp_path, working_dir=str(tmp_path / "jobs" / ".." / ".."))
    assert f"resolves to {tmp_path.parent}" in escaped
    linked = refusal(policy, tmp_path, working_dir=str(tmp_path / "jobs" / "link" / "ssl"))
    assert "resolves to /etc/ssl) is outside the allowed roots" in linked
    assert refusal(policy, tmp_path, working_dir=str(tmp_path / "jobs" / "a" / ".." / "b")) == ""


def test_a_root_given_through_a_symlink_is_resolved_too(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    policy = JobPolicy(allowed_roots=(tmp_path / "alias",))
    assert refusal(policy, tmp_path, working_dir=str(tmp_path / "real" / "run")) == ""


def test_the_launchers_default_working_dir_is_allowed(tmp_path):
    policy = JobPolicy(allowed_roots=())
    assert refusal(policy, tmp_path, working_dir="/opt/jobs/a") != ""
    assert (
        refusal(policy, tmp_path, working_dir="/opt/jobs/a", default_working_dir=Path("/opt/jobs"))
        == ""
    )


@pytest.mark.parametrize(
    ("working_dir", "want"),
    [("runs/a", "is not an absolute path"), ("/tmp/a\0b", "contains a NUL byte")],
    ids=["relative", "NUL byte"],
)
def test_malformed_working_dirs_are_refused(tmp_path, working_dir, want):
    assert want in refusal(JobPolicy(), tmp_path, working_dir=working_dir)


# -- checkpoint directory -------------------------------------------------------------------------


def test_the_checkpoint_dir_must_be_one_component_resolving_inside_its_root(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    assert checkpoint_problems("j-1", root) == []
    for job_id in ("..", ".", "a/b", "../etc", ""):
        assert "is not one path component" in checkpoint_problems(job_id, root)[0]
    (root / "j-evil").symlink_to("/etc")
    (problem,) = checkpoint_problems("j-evil", root)
    assert problem == (
        f"checkpoint directory {root}/j-evil resolves to /etc, outside the checkpoint root "
        f"{root}: remove the link at {root}/j-evil"
    )
    assert refusal(JobPolicy(), tmp_path, job_id="j-evil") == problem


@as_root
def test_a_jobs_directory_is_made_its_users_never_through_a_link(tmp_path):
    directory = tmp_path / "j-1"
    make_private_dir(directory, RunAs(65534, 65534))
    info = directory.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (65534, 65534, 0o700)
    make_private_dir(directory, None)  # the launcher's own user: the mode only
    assert directory.stat().st_uid == 65534
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError, match=r"symbolic links|Not a directory"):
        make_private_dir(tmp_path / "link", RunAs(65534, 65534))
    assert target.stat().st_uid == os.geteuid()
    # Inside a directory the job owns, its planted links are not followed either.
    (directory / "home").symlink_to(target)
    with pytest.raises(OSError, match=r"symbolic links|Not a directory"):
        make_private_subdir(directory, "home", RunAs(65534, 65534))
    assert target.stat().st_uid == os.geteuid()
    assert make_private_subdir(directory, "tmp", RunAs(65534, 65534)) == directory / "tmp"
    assert (directory / "tmp").stat().st_uid == 65534
    # A file the launcher hands the job replaces whatever the job put under its name.
    (directory / "ca.pem").symlink_to(tmp_path / "victim")
    (tmp_path / "victim").write_text("precious")
    write_file(directory, "ca.pem", b"CA")
    assert (tmp_path / "victim").read_text() == "precious"
    assert (directory / "ca.pem").read_bytes() == b"CA"
    assert not (directory / "ca.pem").is_symlink()


def test_the_generation_fence_follows_no_link_the_replica_user_planted(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    directory = tmp_path / "j-1"
    directory.mkdir()
    (directory / f"{GENERATION_FILE}.{os.getpid()}.tmp").symlink_to(victim)
    (directory / GENERATION_FILE).symlink_to(victim)
    fence_checkpoint_dir(directory, 3)
    assert victim.read_text() == "precious\n"
    assert not (directory / GENERATION_FILE).is_symlink()
    assert (directory / GENERATION_FILE).read_text() == "3\n"
    os.mkfifo(directory / "fifo")
    os.replace(directory / "fifo", directory / GENERATION_FILE)
    fence_checkpoint_dir(directory, 4)  # a FIFO is not read (it would block), just replaced
    assert (directory / GENERATION_FILE).read_text() == "4\n"
    fence_checkpoint_dir(directory, 2)  # never lowered
    assert (directory / GENERATION_FILE).read_text() == "4\n"


# -- environment ----------------------------------------------------------------------------------


def test_loader_variables_are_refused_in_env_and_secret_env(tmp_path):
    reason = refusal(
        JobPolicy(),
        tmp_path,
        env={"LD_PRELOAD": "/tmp/x.so", "LR": "0.1", "PYTHONPATH": "/srv/code"},
        secret_env={"LD_AUDIT": "/tmp/a.so", "GLIBC_TUNABLES": "x", "TOKEN": "s"},
    )
    problems = reason.split("; ")
    assert [p.split(" is refused, ")[0] for p in problems] == [
        "env variable LD_PRELOAD",
        "secret_env variable GLIBC_TUNABLES",
        "secret_env variable LD_AUDIT",
    ]
    assert "load other code: set it in the job's command instead" in problems[0]
    assert "job_policy.allow_env" in problems[0]


def test_allow_env_lifts_the_loader_rule_and_deny_env_adds_names_and_prefixes(tmp_path):
    policy = JobPolicy(allow_env=("LD_LIBRARY_PATH",), deny_env=("AWS_*", "HTTP_PROXY"))
    env = {"LD_LIBRARY_PATH": "/opt/cuda/lib64", "LD_PRELOAD": "x", "AWS_SECRET": "s"}
    assert policy.env_problems({**env, "HTTP_PROXY": "p", "HTTPS_PROXY": "p"}, "env") == [
        "env variable AWS_SECRET is refused, as job_policy.deny_env on the launcher names it: "
        "drop it from the job",
        "env variable HTTP_PROXY is refused, as job_policy.deny_env on the launcher names it: "
        "drop it from the job",
        "env variable LD_PRELOAD is refused, as it makes programs the launcher starts load "
        "other code: set it in the job's command instead (env NAME=value program …) or have "
        "the operator add it to job_policy.allow_env",
    ]
    assert "LD_LIBRARY_PATH" in JobPolicy().env_problems(env, "env")[0]


def test_reserved_variables_are_refused_and_the_contract_always_wins(tmp_path):
    assert "POLLUX_* is reserved" in refusal(JobPolicy(), tmp_path, env={"POLLUX_NODE_FENCE": "x"})
    # The contract's other names may be set (for runs outside Pollux) but never win.
    spec = pb.JobSpec(env={"RANK": "9", "MASTER_ADDR": "evil", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert JobPolicy().env_problems(spec.env, "env") == []
    plan = ReplicaPlan(0, 0, 1, 1, 1, "10.0.0.1", 29500, 1)
    contract = contract_env(
        plan,
        job_id="j-1",
        generation=1,
        agent_addrs=[],
        checkpoint_dir="/ck",
        cuda=True,
        fence_token="n1@x",
    )
    env = replica_env({}, spec, contract)
    assert (env["RANK"], env["MASTER_ADDR"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "10.0.0.1", "1")
    assert env["POLLUX_NODE_FENCE"] == "n1@x"


# -- replica user ---------------------------------------------------------------------------------


def test_a_root_launcher_runs_each_job_under_its_own_uid_unless_one_is_configured():
    policy = JobPolicy()
    assert policy.run_as(0, job_uid=1_879_050_000) == RunAs(1_879_050_000, 1_879_050_000)
    with pytest.raises(ValueError, match="job's uid"):
        policy.run_as(0)
    assert policy.run_as(1000, job_uid=1_879_050_000) is None  # not root: the launcher's user
    assert policy.per_job_uids(0)
    assert not policy.per_job_uids(1000)
    shared = JobPolicy(run_as_uid=65534)
    assert shared.run_as(1000) is None
    assert shared.run_as(0) == RunAs(65534, pwd.getpwuid(65534).pw_gid)
    assert shared.run_as(0, job_uid=5) == RunAs(65534, pwd.getpwuid(65534).pw_gid)
    assert JobPolicy(run_as_uid=65534, run_as_gid=100).run_as(0) == RunAs(65534, 100)
    unknown = 4_000_000
    with pytest.raises(KeyError):
        pwd.getpwuid(unknown)
    assert JobPolicy(run_as_uid=unknown).run_as(0) == RunAs(unknown, unknown)


def test_a_launcher_that_cannot_isolate_jobs_says_why_and_what_to_do():
    assert JobPolicy().isolation_problem(0) == ""
    not_root = JobPolicy().isolation_problem(1000)
    assert not_root.startswith("the launcher runs as uid 1000, not root")
    assert "run the launcher as root" in not_root
    shared = JobPolicy(run_as_uid=65534).isolation_problem(0)
    assert shared.startswith("job_policy.run_as_uid = 65534 runs every job's replicas as one user")
    assert "unset it" in shared


def test_the_exec_helper_switches_the_user_and_keeps_the_parent_death_signal(tmp_path):
    # The helper (exec_as.py) switches user, arms the death signal and execs; it runs with an
    # interpreter's isolated mode and reads the environment from the descriptor, never argv.
    # tests/integration/test_exec_as.py runs it for real (a killed launcher's replica dies).
    spec = LaunchSpec(["true"], {"PATH": os.defpath, "TOKEN": "hidden"}, None, tmp_path / "log")
    as_nobody = dataclasses.replace(spec, run_as=RunAs(65534, 65533), cwd="/srv")
    helper = [sys.executable, "-I", "-S", exec_as.HELPER, "--env-fd", "7"]
    assert with_launcher_fence(as_nobody, 7) == [
        *helper,
        *("--parent", str(os.getpid())),
        *("--user", "65534:65533"),
        *("--cwd", "/srv"),
        "--",
        "true",
    ]
    assert with_launcher_fence(spec, 7) == [*helper, "--parent", str(os.getpid()), "--", "true"]
    assert "hidden" not in " ".join(with_launcher_fence(as_nobody, 7))
    with pytest.raises(FileNotFoundError):
        with_launcher_fence(dataclasses.replace(spec, command=["no-such-program-here"]), 7)


def test_root_replicas_need_allow_root_and_per_job_uids_never_run_as_root(tmp_path):
    assert refusal(JobPolicy(), tmp_path, launcher_uid=0) == ""  # per-job uids: never root
    reason = refusal(JobPolicy(run_as_uid=0, allow_root=False), tmp_path, launcher_uid=0)
    assert "job_policy.allow_root = false forbids: unset job_policy.run_as_uid" in reason
    assert refusal(JobPolicy(run_as_uid=0, allow_root=True), tmp_path, launcher_uid=0) == ""
    assert refusal(JobPolicy(run_as_uid=65534), tmp_path, launcher_uid=0) == ""


# -- configuration --------------------------------------------------------------------------------


def test_invalid_settings_are_each_reported():
    policy = JobPolicy(
        allowed_roots=(Path("jobs"),),
        deny_env=("A-B", "OK_*"),
        allow_env=("LD_*",),
        run_as_uid=-1,
        run_as_gid=2**32,
        job_uids=(0, 10),
    )
    assert [p.split(":")[0] for p in policy.problems()] == [
        "allowed_roots",
        "deny_env",
        "allow_env",
        "run_as_uid",
        "run_as_gid",
        "job_uids",
    ]
    assert JobPolicy(job_uids=(10, 5)).problems()[0].startswith("job_uids: [10, 5] must be")
    assert JobPolicy(job_uids=(10,)).problems()[0].startswith("job_uids: [10] must be")
    assert JobPolicy(run_as_gid=5).problems() == [
        "run_as_gid: set run_as_uid too (a group alone changes nothing)"
    ]
    assert JobPolicy(run_as_uid=0, allow_root=False).problems() == [
        "run_as_uid: 0 is root, which allow_root = false forbids"
    ]
    assert JobPolicy().problems() == []


def test_the_section_loads_from_toml_and_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "launcher.toml"
    path.write_text(
        '[job_policy]\nallowed_roots = ["/srv/jobs", "/tmp"]\ndeny_env = ["AWS_*"]\n'
        "allow_root = false\njob_uids = [300000, 365535]\n"
    )
    monkeypatch.setenv("POLLUX_LAUNCHER_JOB_POLICY__RUN_AS_UID", "65534")
    config = load(LauncherConfig, path, "POLLUX_LAUNCHER")
    assert config.job_policy == JobPolicy(
        allowed_roots=(Path("/srv/jobs"), Path("/tmp")),
        deny_env=("AWS_*",),
        run_as_uid=65534,
        allow_root=False,
        job_uids=(300000, 365535),
    )
    monkeypatch.setenv("POLLUX_LAUNCHER_JOB_POLICY__RUN_AS_UID", "0")
    with pytest.raises(ConfigError) as caught:
        load(LauncherConfig, path, "POLLUX_LAUNCHER")
    assert caught.value.problems == [
        "job_policy.run_as_uid: 0 is root, which allow_root = false forbids"
    ]


def test_a_working_dir_closed_to_other_users_is_refused_where_jobs_get_their_own_uid(tmp_path):
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    home.chmod(0o700)
    policy = JobPolicy(allowed_roots=(tmp_path,))
    work = str(home / "project")
    assert refusal(policy, tmp_path, working_dir=work, launcher_uid=0) == (
        f"working_dir {work} cannot be entered by the job's own uid, which replicas run under: "
        f"{home} (mode 700) is closed to other users; chmod o+x {home}, or keep the job's files "
        "under a directory others may enter"
    )
    # The launcher's own user runs the replicas (not root, or one uid for all): it may enter.
    assert refusal(policy, tmp_path, working_dir=work, launcher_uid=1000) == ""
    home.chmod(0o711)
    assert refusal(policy, tmp_path, working_dir=work, launcher_uid=0) == ""
