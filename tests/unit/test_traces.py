"""Trace readers: the published data loads, and malformed files fail with file and line."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from pollux.sim.traces import (
    ThroughputTrace,
    TraceFormatError,
    default_data_root,
    load_application,
    load_applications,
)

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "pollux-osdi21"
APPS = {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}


def test_published_applications_load_with_their_constants():
    apps = load_applications(default_data_root() / "traces")
    assert set(apps) == APPS
    cifar = apps["cifar10"]
    assert (cifar.init_batch_size, cifar.max_batch_size) == (128, 4096)
    assert cifar.atomic_bsz_range == (32, 1024)
    assert len(cifar.validation[128].progress) == 100
    # Every one of the 108 placement rotation classes of 1–4 nodes × 1–4 GPUs is present.
    assert all(len(set(a.placements.placement)) == 108 for a in apps.values())
    assert np.all(cifar.placements.accum_time > 0)


def test_vendored_data_is_byte_identical_to_its_checksums():
    root = default_data_root()
    for line in (root / "MD5SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        assert hashlib.md5((root / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared data set beside this checkout")
def test_vendored_data_matches_the_shared_copy():
    root = default_data_root()
    for line in (root / "MD5SUMS").read_text().splitlines():
        _, name = line.split(maxsplit=1)
        assert (root / name).read_bytes() == (SHARED / name).read_bytes(), name


def test_mean_by_configuration_merges_placements_with_the_same_shape():
    trace = load_application(default_data_root() / "traces" / "cifar10").placements
    merged = trace.mean_by_configuration()
    keys = set(zip(trace.num_nodes, trace.num_replicas, trace.atomic_bsz, strict=True))
    assert len(merged) == len(keys)
    pick = (merged.num_nodes == 2) & (merged.num_replicas == 4) & (merged.atomic_bsz == 64)
    rows = (trace.num_nodes == 2) & (trace.num_replicas == 4) & (trace.atomic_bsz == 64)
    assert rows.sum() == 2  # placements "13" and "22"
    assert merged.step_time[pick][0] == pytest.approx(trace.step_time[rows].mean())


def write_app(tmp_path: Path, placements: str) -> Path:
    app = tmp_path / "toy"
    app.mkdir()
    (app / "placements.csv").write_text(placements)
    (app / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,32,0.2,0.1\n"
    )
    (app / "validation-32.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n10,10,0.5,1.0,2.0\n"
    )
    return app


def test_a_well_formed_toy_application_loads(tmp_path):
    app = load_application(
        write_app(tmp_path, "placement,local_bsz,step_time,sync_time\n12,32,0.2,0.05\n")
    )
    assert isinstance(app.placements, ThroughputTrace)
    assert (app.placements.num_nodes[0], app.placements.num_replicas[0]) == (2, 3)


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("placement,bsz,step_time,sync_time\n12,32,0.2,0.05\n", 1, "header"),
        ("placement,local_bsz,step_time,sync_time\n12,32,abc,0.05\n", 2, "not a number"),
        ("placement,local_bsz,step_time,sync_time\n12,32,0.2\n", 2, "columns"),
        ("placement,local_bsz,step_time,sync_time\n1x,32,0.2,0.05\n", 2, "digits"),
        ("placement,local_bsz,step_time,sync_time\n12,32,-1,0.05\n", 2, "≥ 0"),
        ("placement,local_bsz,step_time,sync_time\n", None, "no data rows"),
        ("placement,local_bsz,step_time,sync_time\n12,32,0.2,0.3\n", None, "sync_time"),
    ],
    ids=[
        "wrong header",
        "non-numeric time",
        "missing column",
        "bad placement",
        "negative time",
        "no rows",
        "sync longer than step",
    ],
)
def test_malformed_placements_name_file_and_line(tmp_path, body, line, message):
    with pytest.raises(TraceFormatError, match=message) as err:
        load_application(write_app(tmp_path, body))
    assert err.value.path.name == "placements.csv"
    assert err.value.line == line


def test_missing_directory_and_data_root_are_clear(tmp_path, monkeypatch):
    with pytest.raises(TraceFormatError, match="not a directory"):
        load_application(tmp_path / "absent")
    monkeypatch.setenv("POLLUX_DATA", str(tmp_path))
    with pytest.raises(TraceFormatError, match="POLLUX_DATA"):
        default_data_root()
