"""Job weights in Pollux's objective: a product of named factors, combined in one place.

Each job's utility in the power mean may be scaled by a weight. Three parts of the policy want
one: the jct mode ranks jobs by their remaining work (`pollux.policy.jct.rank_weights`), a
tenant-share method tilts each job by its tenant's share or what its tenant is owed
(`pollux.policy.tenant_shares`), and the users of a tenant share it alike
(`pollux.policy.owners.owner_factor`). Each factor is computed by a pure function from the
round's `Problem` or its state; `WeightFactors.combined` multiplies them here, and only
here, so no factor overwrites another. Without any factor every job weighs alike (faithful
Pollux).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class WeightFactors:
    """The factors of each job's weight; None: the factor does not apply this round.

    Attributes:
        remaining_work: The jct mode's remaining-work rank (heSRPT weights), largest 1.
        tenant: The tenant-share method's per-job tilt, largest 1.
        owner: Each user's equal part of its tenant's weight, split over its jobs, largest 1.
    """

    remaining_work: FloatArray | None = None
    tenant: FloatArray | None = None
    owner: FloatArray | None = None

    def combined(self) -> FloatArray | None:
        """The product of the factors that apply, scaled to a largest of 1; None if none does.

        A zero product (every factor 0 somewhere) is left unscaled.
        """
        present = [f for f in (self.tenant, self.remaining_work, self.owner) if f is not None]
        if not present:
            return None
        out = present[0]
        for factor in present[1:]:
            out = out * factor
        top = float(out.max(initial=0.0))
        return out / top if top > 0 else out
