"""A job reading, from its replica, what is not its own: every attempt REFUSED.

Bob's job tries the admin's ``pollux-cli`` context, the work dir's ``pki/`` (its listing, the CA
key, the kept admin token, the launcher's and etcd's keys), and alice's job's checkpoint and
log; a control reads its own checkpoint. Made only where the check can see the cluster's files
(its own cluster, or ``--pki-dir`` inside a `pollux-up` work dir).
"""

from __future__ import annotations

from pathlib import Path

from .session import Session


async def replica_reads(session: Session, users: dict[str, str]) -> None:
    """Bob's job tries to read every credential but its own from its replica: all refused.

    Alice's job first leaves a checkpoint and a log line; bob's job then tries each path
    and prints ``READ`` or ``REFUSED`` per path (its log is read back from the work dir).
    """
    workdir = session.target.workdir
    if workdir is None:
        return
    victim_script = (
        "import os, pathlib\n"
        "d = pathlib.Path(os.environ['POLLUX_CHECKPOINT_DIR'])\n"
        "(d / 'weights').write_text('alice-weights')\n"
        "print('alice-log-line', flush=True)\n"
    )
    victim = await session.run_job(users["alice"], "check-victim-files", victim_script, [])
    if victim is None:
        return
    pki_dir, context = session.target.pki_dir, session.target.admin_context
    targets = {
        "the admin's pollux-cli context (~/.config/pollux/config.toml)": context,
        "the work dir's pki/ listing": pki_dir,
        "the CA key (pki/ca-key.pem)": pki_dir / "ca-key.pem",
        "the kept admin token (pki/admin-token)": pki_dir / "admin-token",
        "etcd's key (pki/etcd-key.pem)": pki_dir / "etcd-key.pem",
        **{
            f"the launcher's key (pki/{key.name})": key
            for key in sorted(pki_dir.glob("node-*-key.pem"))
        },
        "another user's job's checkpoint dir": workdir / "checkpoints" / victim.id,
        "another user's job's checkpoint": workdir / "checkpoints" / victim.id / "weights",
        "another user's job's log": workdir / "replica-logs" / victim.id / "1-0.log",
    }
    tried = {name: path for name, path in targets.items() if path is not None}
    thief_script = (
        "import os, sys\n"
        "for i, path in enumerate(sys.argv[1:]):\n"
        "    if path == 'OWN':\n"
        "        path = os.path.join(os.environ['POLLUX_CHECKPOINT_DIR'], 'mine')\n"
        "        open(path, 'w').write('x')\n"
        "    try:\n"
        "        if os.path.isdir(path):\n"
        "            got = ' '.join(sorted(os.listdir(path)))\n"
        "        else:\n"
        "            got = open(path, 'rb').read(64).hex()\n"
        "        print(f'ATTEMPT {i} READ {got[:40]}', flush=True)\n"
        "    except OSError as error:\n"
        "        print(f'ATTEMPT {i} REFUSED {error.strerror}', flush=True)\n"
    )
    argv = [str(path) for path in tried.values()] + ["OWN"]
    thief = await session.run_job(users["bob"], "check-thief-files", thief_script, argv)
    if thief is None:
        return
    answers = attempt_lines(workdir / "replica-logs" / thief.id)
    for index, (name, path) in enumerate(tried.items()):
        got, message = answers.get(index, ("NOT_TRIED", "the job printed nothing for it"))
        session.record(f"a job reads {name} ({path})", "REFUSED", got, message)
    got, message = answers.get(len(tried), ("NOT_TRIED", "the job printed nothing for it"))
    session.record("(control) a job reads a file in its own checkpoint dir", "READ", got, message)


def attempt_lines(logs: Path) -> dict[int, tuple[str, str]]:
    """``ATTEMPT <i> <READ|REFUSED> <detail>`` lines of a job's logs, by i."""
    out: dict[int, tuple[str, str]] = {}
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[0] == "ATTEMPT" and parts[1].isdigit():
                out[int(parts[1])] = (parts[2], parts[3] if len(parts) > 3 else "")
    return out
