"""`pollux-up`'s parts alone: the work dir's layout, the local PKI, log tails and byte counts."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pollux.service.local import workdir
from pollux.service.local.etcd import shown_bytes
from pollux.service.local.pki import LocalPki, read_private, write_private
from pollux.service.local.procs import last_line


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_work_dir_is_traversable_and_its_keys_and_logs_private(tmp_path: Path) -> None:
    root = tmp_path / "work"
    workdir.prepare(root, root / "pki", tmp_path / "etcd")
    assert mode(root) == 0o711
    assert mode(root / "logs") == mode(root / "pki") == mode(tmp_path / "etcd") == 0o700


def test_the_first_directory_others_cannot_traverse_is_named(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    for directory in (tmp_path, tmp_path / "a", inner):
        directory.chmod(0o755)
    if workdir.untraversable(tmp_path) is not None:
        pytest.skip("the temporary directory's parents are not traversable by others")
    assert workdir.untraversable(inner) is None
    (tmp_path / "a").chmod(0o750)
    assert workdir.untraversable(inner) == tmp_path / "a"
    assert workdir.untraversable(tmp_path / "missing" / "x") == tmp_path / "missing"


def test_a_service_certificate_is_made_once_under_one_ca(tmp_path: Path) -> None:
    local = LocalPki(tmp_path)
    first = local.identity("scheduler-0")
    assert local.ca_file.is_file()
    assert mode(first.key) == 0o600
    ca = local.ca_file.read_bytes()
    again = local.identity("scheduler-0")
    assert again == first
    assert local.identity("node-0").cert != first.cert
    assert local.ca_file.read_bytes() == ca  # one CA for every service
    flags = local.tls_flags("node-0")
    assert flags[:2] == ["--tls-ca", str(local.ca_file)]
    assert local.etcd_tls().paths[0] == local.ca_file


def test_a_secret_file_is_private_from_its_creation_and_read_back_stripped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "admin-token"
    assert read_private(path) == ""
    write_private(path, "pollux_abc")
    assert mode(path) == 0o600
    assert read_private(path) == "pollux_abc"
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_a_logs_last_line_is_its_last_non_empty_one_cut_to_300(tmp_path: Path) -> None:
    log = tmp_path / "etcd.log"
    assert last_line(log) == ""
    log.write_text("starting\n" + "x" * 500 + "\n\n  \n")
    assert last_line(log) == "x" * 300
    log.write_text("one\nfatal: no space left on device\n")
    assert last_line(log) == "fatal: no space left on device"


def test_byte_counts_read_as_mib_from_one_mib() -> None:
    assert shown_bytes(1023) == "1023 bytes"
    assert shown_bytes(3 * 2**20 // 2) == "1.5 MiB"
