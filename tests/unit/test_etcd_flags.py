"""Every way Pollux starts etcd turns on auto-compaction (etcd keeps all history otherwise)."""

from __future__ import annotations

from pathlib import Path

from pollux.service.local.etcd import LocalEtcd
from pollux.service.local.pki import LocalPki
from pollux.service.local_cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]


def test_pollux_up_starts_etcd_with_auto_compaction(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    members = LocalEtcd(3, data_root=tmp_path, logs=tmp_path, pki=LocalPki(tmp_path / "pki"))
    members.ports = [(1, 2), (3, 4), (5, 6)]
    started = [members.argv(index) for index in range(3)]
    assert [a for a in started[2] if a.startswith("--initial-cluster=")] == [
        "--initial-cluster=pollux-local-0=https://127.0.0.1:2,"
        "pollux-local-1=https://127.0.0.1:4,pollux-local-2=https://127.0.0.1:6"
    ]
    for argv in started:
        assert "--auto-compaction-mode=periodic" in argv
        assert "--auto-compaction-retention=5m" in argv
        # Secure by default: TLS for clients and peers, and only clients with our certificates.
        assert "--client-cert-auth" in argv
        assert "--peer-client-cert-auth" in argv
        assert any(a.startswith("--listen-client-urls=https://") for a in argv)
        assert any(a.startswith("--trusted-ca-file=") for a in argv)


def test_the_compose_file_and_the_operator_guide_say_the_same() -> None:
    compose = (REPO / "deploy" / "compose.yaml").read_text()
    guide = (REPO / "deploy" / "README.md").read_text()
    for text in (compose, guide):
        assert "--auto-compaction-mode periodic" in " ".join(text.split())
        assert "--auto-compaction-retention 5m" in " ".join(text.split())


def test_a_cluster_makes_its_etcd_members_as_configured(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, etcd_members=3, etcd_dir=tmp_path / "etcd-disk")
    assert cluster.members.members == 3
    assert cluster.etcd_data_dir(1) == tmp_path / "etcd-disk" / "etcd-1"
    assert cluster.members.pki is cluster.pki
    assert LocalCluster(tmp_path, secure=False).members.pki is None
