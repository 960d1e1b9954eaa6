"""The container command line, the launcher's runtime settings and the container job policy.

Pure functions, no runtime: the same rules run against real podman in
tests/integration/test_launcher_containers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pollux.launcher.config import LauncherConfig
from pollux.launcher.containers import (
    Container,
    RunRequest,
    container_env,
    mount_problems,
    run_argv,
)
from pollux.launcher.job_policy import JobPolicy, RunAs
from pollux.v1 import types_pb2 as pb


def request(**changes: object) -> RunRequest:
    fields: dict[str, object] = {
        "runtime": "podman",
        "binary": "/usr/bin/podman",
        "image": "ghcr.io/org/train:1.2",
        "command": ["python", "train.py", "--lr", "0.1"],
        "env_names": ["RANK", "POLLUX_JOB_CREDENTIAL", "TOKEN"],
        "job_id": "j-1",
        "generation": 3,
        "rank": 2,
        "fence_token": "n1@0123456789abcdef",
        "user": RunAs(65534, 65534),
        "checkpoint_dir": "/ckpt/j-1",
    }
    fields.update(changes)
    return RunRequest(**fields)  # type: ignore[arg-type]


def test_a_podman_run_carries_the_contract_by_name_labels_and_mounts() -> None:
    argv = run_argv(
        request(
            tls_ca="/etc/pollux/ca.pem",
            working_dir="/work",
            shm_size_mb=2048,
            mounts=[("/srv/data", "/data", True), ("/scratch", "/scratch", False)],
            flags=["--runtime", "runc"],
        )
    )
    assert argv[:4] == ["/usr/bin/podman", "run", "--runtime", "runc"]
    assert argv[-5:] == ["ghcr.io/org/train:1.2", "python", "train.py", "--lr", "0.1"]
    text = " ".join(argv)
    for part in (
        "--rm --init --sig-proxy=false",
        "--name pollux-j-1-3-2",
        "--network=host",
        "--label pollux.fence=n1@0123456789abcdef",
        "--label pollux.job=j-1",
        "--user 65534:65534",
        "--log-driver=none",
        "-e POLLUX_JOB_CREDENTIAL -e RANK -e TOKEN",  # names only, sorted
        "-v /ckpt/j-1:/ckpt/j-1",
        "-v /etc/pollux/ca.pem:/etc/pollux/ca.pem:ro",
        "-v /srv/data:/data:ro -v /scratch:/scratch",
        "-w /work",
        "--shm-size 2048m",
    ):
        assert part in text, part
    assert "--device" not in argv
    assert "--gpus" not in argv
    assert "--userns=keep-id" not in argv


def test_gpus_rootless_and_docker() -> None:
    podman = run_argv(request(gpu=1, rootless=True))
    assert "--device nvidia.com/gpu=1" in " ".join(podman)
    assert "--userns=keep-id" in podman
    docker = run_argv(request(runtime="docker", binary="/usr/bin/docker", gpu=1, rootless=True))
    assert "--gpus device=1" in " ".join(docker)
    assert "--userns=keep-id" not in docker
    assert "--log-driver=none" not in docker
    assert "--shm-size" not in docker  # 0: the runtime's default
    assert "-w" not in docker  # the image's working directory


def test_removal_kills_without_grace() -> None:
    assert Container("podman", "podman", "pollux-j-1-3-2").remove_argv() == [
        "podman",
        "rm",
        "--force",
        "--time",
        "0",
        "--ignore",
        "pollux-j-1-3-2",
    ]
    assert Container("docker", "docker", "x").remove_argv() == ["docker", "rm", "--force", "x"]


def test_a_remote_client_puts_the_global_flags_before_every_subcommand() -> None:
    remote = ("--remote", "--url", "unix:///run/podman/podman.sock")
    argv = run_argv(request(global_flags=remote, flags=["--ulimit", "nofile=1024:1024"]))
    assert argv[:6] == ["/usr/bin/podman", *remote, "run", "--ulimit"]
    container = request(global_flags=remote).container()
    assert container.remove_argv()[:5] == ["/usr/bin/podman", *remote, "rm"]
    assert container.signal_argv() == [
        "/usr/bin/podman",
        *remote,
        "kill",
        "--signal",
        "TERM",
        "pollux-j-1-3-2",
    ]


def test_a_gpu_container_sees_its_one_gpu_as_device_0() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3", "RANK": "0"}
    assert container_env(env, gpu=True) == {"CUDA_VISIBLE_DEVICES": "0", "RANK": "0"}
    assert container_env({"CUDA_VISIBLE_DEVICES": ""}, gpu=False) == {"CUDA_VISIBLE_DEVICES": ""}


def test_mounts_must_resolve_inside_an_allowed_prefix(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "escape").symlink_to("/etc")
    allowed = [tmp_path / "data"]
    ok = [(str(tmp_path / "data"), "/data", True), (str(tmp_path / "data" / "sub"), "/s", False)]
    assert mount_problems(ok, allowed, node="n1") == []
    bad = [("/etc", "/e", True), (str(tmp_path / "data" / "escape"), "/x", False)]
    problems = mount_problems(bad, allowed, node="n1")
    assert len(problems) == 2
    assert problems[0] == (
        f"mount of /etc is not allowed on n1 (container_mounts_allowed: {tmp_path / 'data'}): "
        "have the operator allow it or drop the mount"
    )
    assert "(container_mounts_allowed: (none))" in mount_problems(bad, [], node="n1")[0]


@pytest.mark.parametrize(
    ("changes", "want"),
    [
        ({"runtime": "lxc"}, "runtime: 'lxc' must be one of process, podman, docker"),
        ({"runtime_flags": ("",)}, "runtime_flags: '' must be a non-empty argument"),
        (
            {"container_mounts_allowed": (Path("data"),)},
            "container_mounts_allowed: 'data' must be an absolute path",
        ),
    ],
)
def test_bad_runtime_settings_are_config_problems(changes: dict[str, object], want: str) -> None:
    config = LauncherConfig(node_name="n1", **changes)  # type: ignore[arg-type]
    assert any(p.startswith(want) for p in config.problems()), config.problems()


def test_runtime_defaults_to_plain_processes() -> None:
    config = LauncherConfig(node_name="n1")
    assert (config.runtime, config.runtime_flags, config.container_mounts_allowed) == (
        "process",
        (),
        (),
    )
    assert config.problems() == []


def test_a_container_working_dir_is_a_path_in_the_image(tmp_path: Path) -> None:
    policy = JobPolicy(allowed_roots=(tmp_path,), allow_root=False)

    def refusal(**fields: object) -> str:
        spec = pb.JobSpec(name="c", command=["python"], **fields)  # type: ignore[arg-type]
        return policy.refusal(
            spec,
            job_id="j-1",
            checkpoint_root=tmp_path,
            default_working_dir=None,
            launcher_uid=0,
        )

    # In an image, /workspace need not be under the host's allowed roots.
    assert refusal(image="train:1", working_dir="/workspace") == ""
    assert "not an absolute path in the image" in refusal(image="train:1", working_dir="work")
    assert "LD_PRELOAD is refused" in refusal(image="train:1", env={"LD_PRELOAD": "x.so"})
    # What configures the runtime's client (which passes the job's variables on) is refused.
    refused = refusal(image="train:1", env={"CONTAINERS_CONF": "/tmp/c.conf", "HOME": "/h"})
    assert "env variable CONTAINERS_CONF is refused, as it configures the container" in refused
    assert "env variable HOME is refused" in refused
    # Without an image, HOME is the job's own business (its replicas run as its own uid).
    assert refusal(env={"HOME": "/h"}, working_dir=str(tmp_path), image="") == ""
    as_root = JobPolicy(allowed_roots=(tmp_path,), run_as_uid=0)
    assert as_root.problems() == ["run_as_uid: 0 is root, which allow_root = false forbids"]
    assert "job_policy.allow_root = false forbids" in as_root.refusal(
        pb.JobSpec(name="c", command=["python"]),
        job_id="j-1",
        checkpoint_root=tmp_path,
        default_working_dir=None,
        launcher_uid=0,
    )
    trusting = JobPolicy(allow_env=("HOME",))
    assert (
        trusting.env_problems({"HOME": "/h", "DOCKER_HOST": "x"}, "env", container=True)[0]
        == "env variable DOCKER_HOST is refused, as it configures the container runtime the "
        "launcher runs the image with: set it in the image or the job's command instead, or "
        "have the operator add it to job_policy.allow_env"
    )
    # Without an image the host rules stand.
    assert "outside the allowed roots" in refusal(working_dir="/workspace")


RUNTIME_VARIABLES = (
    # storage (containers-storage.conf(5), podman(1))
    "STORAGE_DRIVER",
    "STORAGE_OPTS",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_CONF",
    "CONTAINERS_CONF_OVERRIDE",
    "_CONTAINERS_USERNS_CONFIGURED",
    "_CONTAINERS_ROOTLESS_UID",
    # registries and their credentials
    "CONTAINERS_REGISTRIES_CONF",
    "REGISTRY_AUTH_FILE",
    "REGISTRIES_CONFIG_PATH",
    "DOCKER_CONFIG",
    # the daemon or service the client talks to
    "CONTAINER_HOST",
    "CONTAINER_CONNECTION",
    "CONTAINER_SSHKEY",
    "PODMAN_CONNECTIONS_CONF",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "SSH_AUTH_SOCK",
    # proxies, in both cases
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "FTP_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    # CA bundles
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    # configuration lookup and the helpers the runtime finds on PATH
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
    "TMPDIR",
    "PATH",
    "GODEBUG",
)


@pytest.mark.parametrize("name", RUNTIME_VARIABLES)
def test_every_variable_that_configures_the_runtime_is_refused_in_an_image_job(name: str) -> None:
    policy = JobPolicy()
    for where in ("env", "secret_env"):
        (problem,) = policy.env_problems({name: "x"}, where, container=True)
        assert problem.startswith(f"{where} variable {name} is refused, as it configures the")
    # A plain process job sets what it likes of these: they reach only its own program.
    assert policy.env_problems({name: "x"}, "env", container=False) == []
    # The operator may trust one explicitly.
    assert JobPolicy(allow_env=(name,)).env_problems({name: "x"}, "env", container=True) == []


def test_ordinary_job_variables_pass_in_an_image_job() -> None:
    ordinary = {"STORAGE_BUCKET": "b", "REGISTRY_URL": "r", "GOOGLE_CLOUD_PROJECT": "p", "LR": "1"}
    assert JobPolicy().env_problems(ordinary, "env", container=True) == []
