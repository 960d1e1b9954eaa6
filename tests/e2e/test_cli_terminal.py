r"""End to end: a job's terminal escapes reach the reader of `pollux-cli` as text, not as orders.

A secure local cluster (etcd, a scheduler, an agent, one launcher with one CPU "GPU slot") runs
a job whose output clears the screen, writes the clipboard (OSC 52), retitles the window,
hides a link, sends a C1 CSI and a bidi override, then fails. The real CLI, a subprocess as a
person would run it, must print all of it as visible text (``\x1b[2J``) in `submit --follow`,
`logs` and `describe`, keep the job's own lines and tabs, and print it as written with
``--raw``; the history's reasons (the failed replica's output tail) are stored escaped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from pollux.service.local_cluster import LocalCluster

# printf's octal escapes: the job's command line itself holds no control character.
SCRIPT = (
    r"printf 'clear\033[2J\033[H\ttitle\033]0;pwned\007\n'; "
    r"printf 'clip\033]52;c;cHduZWQ=\007 "
    r"link\033]8;;https://evil.example/\033\\docs\033]8;;\033\\\n'; "
    r"printf 'c1\302\2332J bidi\342\200\256cod.exe\rok\010\n'; "
    r"printf 'boom\033]52;c;cHduZWQ=\007\n' >&2; exit 1"
)
WRITTEN = [
    "clear\x1b[2J\x1b[H\ttitle\x1b]0;pwned\x07",
    "clip\x1b]52;c;cHduZWQ=\x07 link\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\",
    "c1\x9b2J bidi\u202ecod.exe\rok\x08",
    "boom\x1b]52;c;cHduZWQ=\x07",  # stderr: a replica's log holds both
]
SHOWN = [
    "clear\\x1b[2J\\x1b[H\ttitle\\x1b]0;pwned\\x07",
    "clip\\x1b]52;c;cHduZWQ=\\x07 link\\x1b]8;;https://evil.example/\\x1b\\docs\\x1b]8;;\\x1b\\",
    "c1\\x9b2J bidi\\u202ecod.exe\\rok\\x08",
    "boom\\x1b]52;c;cHduZWQ=\\x07",
]


def controls(text: str) -> list[str]:
    """Control characters in `text` but newlines and tabs (Cc, Zl, Zp, bidi formatting)."""
    return [
        c
        for c in text
        if c not in "\n\t"
        and (unicodedata.category(c) in ("Cc", "Zl", "Zp") or unicodedata.bidirectional(c) in BIDI)
    ]


BIDI = frozenset({"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"})


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path,
        nodes=1,
        gpus_per_node=1,
        schedulers=1,
        agents=1,
        interval_s=1.0,
        lease_ttl_s=2,
        restart_delay_s=1.0,
        dashboard=False,
    ) as c:
        yield c


def cli(cluster: LocalCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run pollux-cli; its output decoded as it is (no newline translation: CR stays CR)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pollux.client.cli",
            "--server",
            cluster.scheduler_addresses[0],
            *args,
        ],
        capture_output=True,
        timeout=timeout,
        check=False,
        env={
            **os.environ,
            "POLLUX_CONFIG": str(cluster.workdir / "no-config.toml"),
            "POLLUX_CA": str(cluster.ca_file),
            "POLLUX_TOKEN": cluster.admin_token or "",
        },
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


@pytest.mark.timeout(180)
def test_a_jobs_escape_sequences_are_printed_as_text_unless_raw(cluster: LocalCluster) -> None:
    followed = cli(
        cluster,
        *("submit", "--follow", "--name", "escapes", "--initial-batch-size", "1"),
        *("--max-failures", "1", "--", "sh", "-c", SCRIPT),
        timeout=150,
    )
    out = followed.stdout
    assert followed.returncode == 3, (out, followed.stderr)  # the job failed
    assert controls(out) == [], out
    job_id = out.split("\t", 1)[0]
    for line in SHOWN:  # each generation's log, as visible text, its tab kept
        assert out.count(f"\n{line}\n") == 2, (line, out)
    failed = [m for m in out.splitlines() if m.startswith("==> ") and " FAILED: " in m]
    assert len(failed) == 1, out  # the output tail in the reason did not break the line
    assert "boom\\x1b]52;c;cHduZWQ=\\x07" in failed[0]
    assert out.rstrip().endswith(f"==> job {job_id} FAILED <==")

    logs = cli(cluster, "logs", job_id)
    assert logs.returncode == 0, logs.stderr
    # (stdout and stderr are two pipes: their lines' order is the launcher's reading order)
    assert sorted(logs.stdout.split("\n")) == sorted([*SHOWN, ""])
    raw = cli(cluster, "logs", "--raw", job_id)
    assert raw.returncode == 0, raw.stderr
    assert sorted(raw.stdout.split("\n")) == sorted([*WRITTEN, ""])

    described = cli(cluster, "describe", job_id)
    assert described.returncode == 0, described.stderr
    assert controls(described.stdout) == []
    assert "boom\\x1b]52;c;cHduZWQ=\\x07" in described.stdout
    # The history holds the escaped reason itself: --raw shows it so, and JSON carries it.
    assert controls(cli(cluster, "--raw", "describe", job_id).stdout) == []
    data = json.loads(cli(cluster, "-o", "json", "describe", job_id).stdout)
    reasons = [t["reason"] for t in data["history"] if t["state"] == "FAILED"]
    assert len(reasons) == 1
    assert "boom\\x1b]52;c;cHduZWQ=\\x07" in reasons[0]
    assert controls(reasons[0]) == []
