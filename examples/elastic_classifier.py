"""Train a small MLP classifier on synthetic data with `pollux.train` (no downloads).

The data are Gaussian clusters, one per class, from a seeded generator, so every run with the
same ``--seed`` sees the same samples. It runs as it is (``python
examples/elastic_classifier.py --epochs 5``), as several replicas under the environment the
Pollux launcher or torchrun sets (``torchrun --nproc-per-node 2 examples/...``), or submitted
to a Pollux cluster (``examples/elastic_job.yaml``), where the trainer reports to the job's
agent and takes its batch size from it. With ``POLLUX_CHECKPOINT_DIR`` (or
``--checkpoint-dir``) set, SIGTERM makes it checkpoint and exit 143, and the next start
resumes there on any number of replicas. The loop is the usual PyTorch loop; the lines that
involve the trainer are marked ``# pollux``. For machines without GPUs, ``--emulate-ms
FIXED,PER_SAMPLE`` sleeps per micro-batch as an accelerator would compute, so CPU slots show a
GPU job's step times, and ``--audit-dir DIR`` logs each replica's samples and each epoch, so a
test can check that elastic restarts neither lose nor repeat samples (docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

import structlog
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

import pollux.train as pt


def make_data(samples: int, features: int, classes: int, seed: int, split: int) -> TensorDataset:
    """Noisy samples around one random centre per class: learnable, but not perfectly.

    The centres depend only on `seed`, so the training (`split` 0) and test (`split` 1) sets
    describe the same problem with different samples.
    """
    centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed * 1000 + 1 + split)
    labels = torch.randint(0, classes, (samples,), generator=generator)
    inputs = 0.4 * centres[labels] + torch.randn(samples, features, generator=generator)
    return TensorDataset(inputs, labels, torch.arange(samples))


def make_model(features: int, classes: int, hidden: int) -> nn.Module:
    """A two-layer perceptron."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training data")
    parser.add_argument("--samples", type=int, default=8192, help="training samples")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64, help="initial total batch M0")
    parser.add_argument("--local-bsz", type=int, default=None, help="fixed per-replica batch")
    parser.add_argument("--accum-steps", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate tuned for M0")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--scaling-rule", default="adascale")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default=None, help="default POLLUX_CHECKPOINT_DIR")
    parser.add_argument(
        "--emulate-ms",
        type=_emulation,
        default=(0.0, 0.0),
        metavar="FIXED,PER_SAMPLE",
        help="sleep FIXED + PER_SAMPLE × batch ms per micro-batch, as an accelerator would take",
    )
    parser.add_argument("--audit-dir", type=Path, default=None, help="sample and epoch logs")
    parser.add_argument("--workers", type=int, default=0, help="data loader worker processes")
    return parser.parse_args(argv)


def _emulation(text: str) -> tuple[float, float]:
    try:
        fixed, per_sample = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want FIXED,PER_SAMPLE in ms, got {text!r}") from None
    if fixed < 0 or per_sample < 0:
        raise argparse.ArgumentTypeError("emulated times must be ≥ 0")
    return fixed, per_sample


def evaluate(model: nn.Module, data: TensorDataset, device: torch.device) -> tuple[float, float]:
    """Mean loss and accuracy of `model` on `data`."""
    inputs, labels = (t.to(device) for t in data.tensors[:2])
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
        loss = functional.cross_entropy(logits, labels).item()
        accuracy = (logits.argmax(1) == labels).float().mean().item()
    model.train()
    return loss, accuracy


class Audit:
    """The ``--audit-dir`` logs: which samples each replica trained on, and each epoch's figures.

    A micro-batch is logged before its step runs; a step cut short by a restart is trained
    again by the next allocation, which starts at the checkpointed step count, so a reader
    keeps, per step number, only the lines of the newest generation that logged it.
    """

    def __init__(self, directory: Path | None, generation: int, rank: int, world: int) -> None:
        self._samples: TextIO | None = None
        self._epochs: TextIO | None = None
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        self._samples = (directory / f"samples-{generation}-{rank}.txt").open("a")
        if rank == 0:
            self._epochs = (directory / "epochs.jsonl").open("a")
        self._prefix = f"{generation} {rank} {world}"

    def batch(self, epoch: int, step: int, indices: torch.Tensor) -> None:
        """Log one micro-batch's sample indices (line-buffered: a kill loses at most one)."""
        if self._samples is not None:
            ids = " ".join(map(str, indices.tolist()))
            self._samples.write(f"{self._prefix} {epoch} {step} {ids}\n")
            self._samples.flush()

    def epoch(self, record: dict[str, object]) -> None:
        """Log one epoch's figures (rank 0)."""
        if self._epochs is not None:
            self._epochs.write(json.dumps(record) + "\n")
            self._epochs.flush()


def _or_dash(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    """Train, printing one line per epoch on rank 0."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)  # same initial weights on every replica and every run
    train = make_data(args.samples, args.features, args.classes, args.seed, split=0)
    test = make_data(1024, args.features, args.classes, args.seed, split=1)
    model = make_model(args.features, args.classes, args.hidden)
    optimizer: torch.optim.Optimizer
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    source = None
    if args.local_bsz is not None:
        source = pt.FixedBatchConfig(pt.BatchConfig(args.local_bsz, args.accum_steps))

    env = pt.init()  # pollux
    trainer = pt.ElasticTrainer(  # pollux
        model,
        optimizer,
        train,
        init_batch_size=args.batch_size,
        batch_source=source,
        scaling_rule=args.scaling_rule,
        checkpoint=pt.CheckpointConfig(directory=args.checkpoint_dir),
        data=pt.DataConfig(seed=args.seed, num_workers=args.workers),
    )
    audit = Audit(args.audit_dir, env.allocation_gen, env.rank, env.world_size)
    fixed_ms, per_sample_ms = args.emulate_ms
    for epoch in trainer.epochs(args.epochs):  # pollux
        total, seen = torch.zeros((), device=trainer.device), 0
        for inputs, labels, indices in trainer.batches():  # pollux
            audit.batch(epoch, trainer.steps, indices)
            loss = functional.cross_entropy(trainer.model(inputs), labels)
            if fixed_ms or per_sample_ms:
                time.sleep((fixed_ms + per_sample_ms * len(labels)) / 1000)
            trainer.step(loss)  # pollux
            total += loss.detach() * len(labels)  # no .item(): it would sync a GPU every batch
            seen += len(labels)
        test_loss, accuracy = evaluate(trainer.module, test, trainer.device)
        # Plotted on the job's page in the dashboard (rank 0's values are the ones sent).
        trainer.log(test_loss=test_loss, accuracy=accuracy)
        if env.rank == 0:
            stats = trainer.grad_stats
            pgns = None if stats is None else stats.pgns(args.batch_size)
            record: dict[str, object] = {
                "epoch": epoch,
                "generation": env.allocation_gen,
                "replicas": env.world_size,
                "train_loss": total.item() / max(seen, 1),
                "test_loss": test_loss,
                "accuracy": accuracy,
                "progress": trainer.progress,
                "steps": trainer.steps,
                "batch": trainer.total_batch_size,
                "pgns": pgns,
                "rescale_pause_s": trainer.rescale_pause_s,
            }
            audit.epoch(record)
            print(
                f"epoch {epoch} train_loss {record['train_loss']:.4f} test_loss {test_loss:.4f} "
                f"accuracy {accuracy:.4f} progress {trainer.progress:.1f} "
                f"steps {trainer.steps} replicas {env.world_size} "
                f"batch {trainer.total_batch_size} pgns {_or_dash(pgns, '.1f')} "
                f"rescale_pause_s {_or_dash(trainer.rescale_pause_s, '.2f')}",
                flush=True,
            )
    trainer.close()
    pt.shutdown()  # pollux: leave the process group before the interpreter exits
    return 0


if __name__ == "__main__":
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    sys.exit(main())
