"""Every way Pollux starts etcd turns on auto-compaction (etcd keeps all history otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pollux.service.local_cluster import LocalCluster, Proc

REPO = Path(__file__).resolve().parents[2]


def test_pollux_up_starts_etcd_with_auto_compaction(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, etcd_members=3)
    cluster._etcd_ports = [(1, 2), (3, 4), (5, 6)]
    started: list[list[str]] = []

    def spawn(name: str, argv: list[str], port: int, *_: Any, **__: Any) -> Proc:
        started.append(argv)
        return Proc(name, None, port, tmp_path / "log")  # type: ignore[arg-type]

    cluster._spawn = spawn  # type: ignore[method-assign]
    for index in range(3):
        cluster._spawn_etcd(index)
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
