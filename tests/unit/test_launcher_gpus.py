"""GPU inventory: nvidia-smi output parsing, CPU slots, and the no-GPU configuration error."""

from __future__ import annotations

import pytest

from pollux.launcher import gpus
from pollux.launcher.gpus import CPU_SLOT, GpuDetectionError, Inventory, parse_nvidia_smi

H100_X4 = """\
0, NVIDIA H100 80GB HBM3
1, NVIDIA H100 80GB HBM3
2, NVIDIA H100 80GB HBM3
3, NVIDIA H100 80GB HBM3
"""


@pytest.mark.parametrize(
    ("output", "want"),
    [
        pytest.param(
            H100_X4,
            Inventory((0, 1, 2, 3), "NVIDIA H100 80GB HBM3", cuda=True),
            id="four identical GPUs give four slots named by the model",
        ),
        pytest.param(
            "0, Tesla V100-SXM2-16GB\n",
            Inventory((0,), "Tesla V100-SXM2-16GB", cuda=True),
            id="one GPU",
        ),
        pytest.param(
            "\n1, NVIDIA A100-SXM4-40GB  \r\n0, NVIDIA A100-SXM4-40GB\n\n",
            Inventory((0, 1), "NVIDIA A100-SXM4-40GB", cuda=True),
            id="blank lines, CRs and padding are tolerated and indices sorted",
        ),
        pytest.param(
            "0, Tesla T4\n1, NVIDIA A10\n2, NVIDIA A10\n",
            Inventory((0, 1, 2), "NVIDIA A10", cuda=True),
            id="mixed models register the most common one",
        ),
        pytest.param(
            "0, NVIDIA H100 80GB HBM3\n2, NVIDIA H100 80GB HBM3\n",
            Inventory((0, 2), "NVIDIA H100 80GB HBM3", cuda=True),
            id="gaps in indices are kept: CUDA_VISIBLE_DEVICES takes the real index",
        ),
    ],
)
def test_parse_nvidia_smi(output: str, want: Inventory) -> None:
    assert parse_nvidia_smi(output) == want


@pytest.mark.parametrize(
    "output",
    [
        pytest.param("", id="no GPUs"),
        pytest.param("No devices were found\n", id="nvidia-smi message instead of csv"),
        pytest.param("0 NVIDIA H100\n", id="missing comma"),
        pytest.param("x, NVIDIA H100\n", id="non-numeric index"),
        pytest.param("0, \n", id="empty name"),
        pytest.param("0, A\n0, A\n", id="duplicate index"),
    ],
)
def test_parse_nvidia_smi_rejects(output: str) -> None:
    with pytest.raises(GpuDetectionError):
        parse_nvidia_smi(output)


def test_explicit_count_means_cpu_slots_even_with_nvidia_smi(monkeypatch) -> None:
    monkeypatch.setattr(gpus.shutil, "which", lambda _: "/usr/bin/nvidia-smi")
    inventory = gpus.detect(3)
    assert inventory == Inventory((0, 1, 2), CPU_SLOT, cuda=False)
    assert inventory.count == 3


def test_no_gpus_and_no_count_is_a_config_error_that_says_what_to_do(monkeypatch) -> None:
    monkeypatch.setattr(gpus.shutil, "which", lambda _: None)
    with pytest.raises(GpuDetectionError, match=r"--gpus N"):
        gpus.detect(None)


def test_zero_cpu_slots_is_rejected() -> None:
    with pytest.raises(GpuDetectionError, match="must be >= 1"):
        gpus.detect(0)


def test_detect_runs_nvidia_smi(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '0, NVIDIA H100 80GB HBM3\\n1, NVIDIA H100 80GB HBM3\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gpus.shutil, "which", lambda _: str(fake))
    assert gpus.detect(None) == Inventory((0, 1), "NVIDIA H100 80GB HBM3", cuda=True)


def test_failing_nvidia_smi_is_reported(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'driver/library version mismatch' >&2\nexit 9\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gpus.shutil, "which", lambda _: str(fake))
    with pytest.raises(GpuDetectionError, match="exited 9: driver/library version mismatch"):
        gpus.detect(None)
