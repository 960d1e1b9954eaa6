"""A tiny trial job for the sweep end-to-end test: a noisy-free bowl, one step per 0.2 s.

Its parameter X (argv[1]) sets how far it lands from the optimum 0.3: after step s of STEPS
it reports ``loss = (X - 0.3)^2 + 1 / (s + 1)`` as a `pollux.hpo` metric line, so a trial
with a worse X is worse at every step (the pruner can tell early). On SIGTERM (a rescale or
a cancel) it saves its step and exits 143; it resumes from the saved step.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from pollux.hpo import report_metric

STEPS = 5


def main() -> int:
    x = float(sys.argv[1])
    ckpt = Path(os.environ["POLLUX_CHECKPOINT_DIR"])
    ckpt.mkdir(parents=True, exist_ok=True)
    saved = ckpt / "step"
    step = int(saved.read_text()) if saved.exists() else 0
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    rank = int(os.environ.get("RANK", "0"))
    while step < STEPS:
        if stop:
            if rank == 0:
                tmp = saved.with_suffix(".tmp")
                tmp.write_text(str(step))
                os.replace(tmp, saved)
            return 143
        time.sleep(0.2)
        if rank == 0:
            report_metric("loss", (x - 0.3) ** 2 + 1 / (step + 1), step)
        step += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
