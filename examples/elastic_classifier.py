"""Train a small MLP classifier on synthetic data with `pollux.train` (no downloads).

The data are Gaussian clusters, one per class, drawn from a seeded generator, so every run with
the same ``--seed`` sees the same samples and (on one process) computes the same numbers.

Runs as it is::

    python examples/elastic_classifier.py --epochs 5

or as several replicas, under the environment the Pollux launcher (or torchrun) sets::

    torchrun --nproc-per-node 2 examples/elastic_classifier.py --epochs 5
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/... &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/...

With ``POLLUX_CHECKPOINT_DIR`` (or ``--checkpoint-dir``) set, SIGTERM makes it checkpoint and
exit with code 143, and the next start resumes where it stopped, on any number of replicas.
The loop is the usual PyTorch loop; the lines that involve the trainer are marked ``# pollux``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

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
    return TensorDataset(inputs, labels)


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
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds (for demos)")
    return parser.parse_args(argv)


def evaluate(model: nn.Module, data: TensorDataset, device: torch.device) -> tuple[float, float]:
    """Mean loss and accuracy of `model` on `data`."""
    inputs, labels = (t.to(device) for t in data.tensors)
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
        loss = functional.cross_entropy(logits, labels).item()
        accuracy = (logits.argmax(1) == labels).float().mean().item()
    model.train()
    return loss, accuracy


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
        checkpoint_dir=args.checkpoint_dir,
        seed=args.seed,
    )
    for epoch in trainer.epochs(args.epochs):  # pollux
        total, seen = 0.0, 0
        for inputs, labels in trainer.batches():  # pollux
            loss = functional.cross_entropy(trainer.model(inputs), labels)
            trainer.step(loss)  # pollux
            total += loss.item() * len(labels)
            seen += len(labels)
            if args.step_sleep:
                time.sleep(args.step_sleep)
        test_loss, accuracy = evaluate(trainer.module, test, trainer.device)
        if env.rank == 0:
            stats = trainer.grad_stats
            print(
                f"epoch {epoch} train_loss {total / max(seen, 1):.4f} test_loss {test_loss:.4f} "
                f"accuracy {accuracy:.4f} progress {trainer.progress:.1f} "
                f"steps {trainer.steps} batch {trainer.total_batch_size} "
                f"pgns {'-' if stats is None else f'{stats.pgns(args.batch_size):.1f}'}",
                flush=True,
            )
    trainer.close()
    return 0


if __name__ == "__main__":
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    sys.exit(main())
