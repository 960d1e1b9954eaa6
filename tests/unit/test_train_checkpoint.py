"""Checkpoints: atomic under SIGKILL, SIGTERM → checkpoint + exit 143 → resume, bad files."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pollux.train import CheckpointError, CheckpointManager, StopSignal  # noqa: E402
from pollux.train.checkpoint import CHECKPOINT_NAME  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_classifier.py"


def child_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLLUX_", "RANK", "WORLD"))}
    env.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra})
    return env


def run_script(tmp_path, text, *args, **popen):
    """Write `text` to a script in `tmp_path` and start it with the test environment."""
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        stdout=subprocess.PIPE,
        env=child_env(),
        text=True,
        **popen,
    )


def test_round_trip_and_missing_checkpoint_is_a_fresh_start(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt")
    assert manager.load() is None
    path = manager.save({"step": 3, "weights": torch.arange(4.0)})
    assert path == tmp_path / "ckpt" / CHECKPOINT_NAME
    state = manager.load()
    assert state["step"] == 3
    assert torch.equal(state["weights"], torch.arange(4.0))
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))


def test_only_rank_zero_writes_and_none_disables(tmp_path):
    assert CheckpointManager(tmp_path, rank=1).save({"x": 1}) is None
    assert not (tmp_path / CHECKPOINT_NAME).exists()
    off = CheckpointManager(None)
    assert not off.enabled
    assert off.save({"x": 1}) is None
    assert off.load() is None


def test_a_stale_generation_never_overwrites_the_newer_generations_checkpoint(tmp_path):
    from pollux.launcher.workspaces import fence_checkpoint_dir

    old, new = CheckpointManager(tmp_path, generation=2), CheckpointManager(tmp_path, generation=3)
    assert old.save({"step": 10}) is not None  # nothing recorded yet: writes
    fence_checkpoint_dir(tmp_path, 3)  # what the launcher does before generation 3 starts
    assert new.save({"step": 11}) is not None
    with pytest.raises(CheckpointError, match="generation 3 owns this directory"):
        old.save({"step": 99})
    assert CheckpointManager(tmp_path).load() == {"step": 11}
    fence_checkpoint_dir(tmp_path, 2)  # a late, older launch never lowers the fence
    assert (tmp_path / ".pollux-generation").read_text().strip() == "3"
    # Outside a launcher (no generation) the fence does not apply.
    assert CheckpointManager(tmp_path).save({"step": 12}) is not None


def test_partial_temporary_file_is_ignored_and_cleaned_up(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save({"step": 1})
    leftover = tmp_path / f".{CHECKPOINT_NAME}.999.dead.tmp"
    leftover.write_bytes(b"\x80\x02half a pickle")
    assert manager.load()["step"] == 1
    manager.save({"step": 2})
    assert not leftover.exists()
    assert manager.load()["step"] == 2


def test_a_corrupt_checkpoint_is_an_error_not_a_silent_fresh_start(tmp_path):
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="move it away"):
        CheckpointManager(tmp_path).load()
    torch.save({"format": "other/9"}, tmp_path / CHECKPOINT_NAME)
    with pytest.raises(CheckpointError, match="format"):
        CheckpointManager(tmp_path).load()


WRITER = textwrap.dedent(
    """
    import sys, structlog, torch
    from pollux.train import CheckpointManager
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    manager = CheckpointManager(sys.argv[1])
    manager.save({"step": 0, "blob": torch.zeros(4)})
    print("saved 0", flush=True)
    step = 1
    while True:  # keep writing large checkpoints until killed
        manager.save({"step": step, "blob": torch.full((24_000_000,), float(step))})
        print(f"saved {step}", flush=True)
        step += 1
    """
)


def test_sigkill_during_save_leaves_the_previous_checkpoint_valid(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = run_script(tmp_path, WRITER, ckpt)
    try:
        assert proc.stdout.readline().strip() == "saved 0"
        deadline = time.monotonic() + 30
        while not list(ckpt.glob(f".{CHECKPOINT_NAME}.*.tmp")):  # a large save has begun
            assert time.monotonic() < deadline, "the writer never started a second save"
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    state = CheckpointManager(ckpt).load()  # the partial temporary file is ignored
    step = state["step"]
    blob = state["blob"]
    assert bool((blob == float(step)).all())  # a whole checkpoint, never a mixture
    assert step == 0 or blob.numel() == 24_000_000


def run_example(ckpt, *args, timeout=60):
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(ckpt), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        text=True,
    )


def test_sigterm_checkpoints_exits_143_and_the_next_start_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    args = ["--samples", "512", "--batch-size", "32", "--epochs", "50", "--emulate-ms", "4,0"]
    proc = run_example(ckpt, *args)
    try:
        first = proc.stdout.readline()
        assert first.startswith("epoch 0"), first + proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    state = CheckpointManager(ckpt).load()
    assert state is not None
    assert state["scaling"]["steps"] >= 16  # at least the finished first epoch
    assert state["loader"]["epoch"] >= 1
    stopped_epoch = state["loader"]["epoch"]
    stopped_steps = state["scaling"]["steps"]

    # Resume with another batch configuration: training continues from the stop.
    resumed = run_example(ckpt, *args[:-2], "--epochs", str(stopped_epoch + 1), "--local-bsz", "16")
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines, err
    assert lines[0].startswith(f"epoch {stopped_epoch} "), out
    after = CheckpointManager(ckpt).load()
    assert after["loader"]["epoch"] == stopped_epoch + 1
    assert after["scaling"]["steps"] > stopped_steps

    # A finished job restarted does no more work.
    again = run_example(ckpt, *args[:-2], "--epochs", str(stopped_epoch + 1))
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert out.strip() == ""


WORKERS_JOB = textwrap.dedent(
    """
    import logging, sys, time, structlog, torch
    from torch import nn
    from torch.utils.data import Dataset
    import pollux.train as pt
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    class Slow(Dataset):  # keeps the loader workers busy when the signal arrives
        def __len__(self):
            return 4000
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.randn(4), i % 2

    model = nn.Linear(4, 2)
    trainer = pt.ElasticTrainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), Slow(), init_batch_size=8,
        connect_agent=False, checkpoint_dir=sys.argv[1], num_workers=2,
    )
    for epoch in trainer.epochs(100):
        for x, y in trainer.batches():
            trainer.step(nn.functional.cross_entropy(trainer.model(x), y))
            if trainer.steps == 3:
                print("training", flush=True)
    """
)


def test_sigterm_to_the_process_group_with_loader_workers_still_checkpoints(tmp_path):
    # The launcher signals a replica's whole process group, data loader workers included; a
    # worker killed by that signal must not make the training process fail before it
    # checkpoints and exits 143.
    ckpt = tmp_path / "ckpt"
    proc = run_script(tmp_path, WORKERS_JOB, ckpt, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "training", line + proc.stderr.read()
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143, err
    state = CheckpointManager(ckpt).load()
    assert state is not None
    assert state["scaling"]["steps"] >= 3


def test_stop_signal_sets_a_flag_and_restores_handlers():
    stop = StopSignal()
    before = signal.getsignal(signal.SIGTERM)
    assert stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.001)
        assert stop.requested
        assert stop.received is signal.SIGTERM
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before
