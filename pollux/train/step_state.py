"""Where the training loop stands within an optimizer step, and the order it must keep.

`ElasticTrainer.batches` hands out micro-batches; each must be followed by one ``step(loss)``
(or ``backward(loss)`` then ``step()``) before the next is asked for. `StepState` holds the
current micro-batch and what has been called for it, and refuses calls out of order with a
`UsageError` that says what to do instead. It also gives each micro-batch its loss weight.
Pure bookkeeping: no torch, no communication.
"""

from __future__ import annotations

from pollux.train.data import MicroBatchInfo
from pollux.train.errors import UsageError


def loss_weight(info: MicroBatchInfo) -> float:
    """The factor of a micro-batch's mean loss, so that a step's gradient is its samples' mean.

    1/s in a regular step of s micro-batches; in an epoch's irregular last step, the
    micro-batch's share of the step's samples over all replicas.
    """
    plan = info.plan
    if plan.regular:
        return 1.0 / plan.config.accum_steps
    return info.size / plan.samples


class StepState:
    """The current micro-batch, what was called for it, and the optimizer steps finished."""

    def __init__(self) -> None:
        self.micro: MicroBatchInfo | None = None
        """The micro-batch being trained on, or None between loops."""
        self.loss_weight = 1.0
        """`loss_weight` of the current micro-batch."""
        self.finished_steps = 0
        """Optimizer steps finished in this process (the same count on every replica)."""
        self._stepped = True
        self._backward = False

    def restart(self) -> None:
        """A new loop over batches begins: nothing is owed for an abandoned micro-batch."""
        self.micro = None
        self._stepped = True

    def begin(self, info: MicroBatchInfo) -> None:
        """A micro-batch is handed out."""
        self.micro = info
        self.loss_weight = loss_weight(info)
        self._stepped = False
        self._backward = False

    def check_stepped(self) -> None:
        """Refuse the next micro-batch while the current one has had no `step`."""
        if not self._stepped:
            raise UsageError(
                "call trainer.step() (or trainer.step(loss)) once for every batch before "
                "asking for the next one"
            )

    def check_backward(self) -> MicroBatchInfo:
        """The current micro-batch, if a backward pass is allowed now."""
        if self.micro is None or self._stepped:
            raise UsageError("backward() must be called inside trainer.batches(), once per batch")
        if self._backward:
            raise UsageError("backward() was already called for this batch")
        return self.micro

    def backward_done(self) -> None:
        """The current micro-batch's backward pass is done."""
        self._backward = True

    def check_step(self) -> MicroBatchInfo:
        """Record the `step` of the current micro-batch, which is returned."""
        if self.micro is None or self._stepped:
            raise UsageError("step() must be called inside trainer.batches(), once per batch")
        if not self._backward:
            raise UsageError("step() needs a loss: call trainer.step(loss) or backward(loss)")
        self._stepped = True
        return self.micro

    def end(self) -> None:
        """The loop over an epoch's batches ended."""
        self.micro = None
