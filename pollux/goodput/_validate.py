"""Input checks shared by the goodput modules; each failure raises `InvalidInputError`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pollux import checks
from pollux.goodput.errors import InvalidInputError

ArrayLike = npt.ArrayLike
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def finite_scalar(
    field: str, value: float, *, minimum: float | None = None, strict: bool = False
) -> float:
    """Return `value` as a float after checking it is finite and not below `minimum`.

    Anything `float` takes is a number here (a 0-d array, a numpy scalar); the range is the
    shared check's (`pollux.checks.real_number`).
    """
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(field, f"must be a number, got {value!r}") from None
    return checks.real_number(
        x,
        above=minimum if strict else None,
        least=None if strict else minimum,
        error=lambda problem: InvalidInputError(field, str(problem)),
    )


def finite_array(
    field: str, values: ArrayLike, *, minimum: float | None = None, strict: bool = False
) -> FloatArray:
    """Return `values` as a float64 array after checking every entry is finite and in range."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInputError(field, "must be numbers") from None
    bad = ~np.isfinite(arr)
    if bad.any():
        raise InvalidInputError(
            field, f"must be finite, got {arr[bad].flat[0]} at index {_first_index(bad)}"
        )
    if minimum is not None:
        low = arr <= minimum if strict else arr < minimum
        if low.any():
            relation = ">" if strict else "≥"
            raise InvalidInputError(
                field,
                f"must be {relation} {minimum}, got {arr[low].flat[0]} "
                f"at index {_first_index(low)}",
            )
    return arr


def integer_array(field: str, values: ArrayLike, *, minimum: int) -> IntArray:
    """Return `values` as an int64 array after checking they are whole numbers ≥ `minimum`."""
    arr = finite_array(field, values)
    whole = np.rint(arr)
    if (whole != arr).any():
        raise InvalidInputError(field, "must be whole numbers")
    if (whole < minimum).any():
        bad = whole < minimum
        raise InvalidInputError(
            field,
            f"must be ≥ {minimum}, got {int(whole[bad].flat[0])} at index {_first_index(bad)}",
        )
    return whole.astype(np.int64)


def broadcast(*named: tuple[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
    """Broadcast arrays together, naming the first one that does not fit the others."""
    try:
        return list(np.broadcast_arrays(*(arr for _, arr in named)))
    except ValueError:
        shapes = ", ".join(f"{name} {arr.shape}" for name, arr in named)
        raise InvalidInputError(
            named[-1][0], f"shapes do not broadcast together: {shapes}"
        ) from None


def allocation_arrays(
    num_nodes: ArrayLike, num_replicas: ArrayLike, *, minimum: int = 1
) -> tuple[IntArray, IntArray]:
    """Broadcast (N, K) together and check minimum ≤ N ≤ K for every pair."""
    nodes = integer_array("num_nodes", num_nodes, minimum=minimum)
    replicas = integer_array("num_replicas", num_replicas, minimum=minimum)
    nodes, replicas = broadcast(("num_nodes", nodes), ("num_replicas", replicas))
    over = nodes > replicas
    if over.any():
        i = _first_index(over)
        raise InvalidInputError(
            "num_nodes",
            f"cannot exceed num_replicas (a node holds at least one replica), got "
            f"N={int(nodes[over].flat[0])} > K={int(replicas[over].flat[0])} at index {i}",
        )
    return nodes, replicas


def _first_index(mask: npt.NDArray[np.bool_]) -> tuple[int, ...] | int:
    idx = np.argwhere(mask)[0]
    return int(idx[0]) if idx.size == 1 else tuple(int(i) for i in idx)


def same_length(fields: Sequence[tuple[str, npt.NDArray[np.generic]]]) -> int:
    """Check 1-D arrays share one non-zero length and return it."""
    lengths = {name: arr.shape for name, arr in fields}
    first_name, first = fields[0]
    for name, arr in fields:
        if arr.ndim != 1:
            raise InvalidInputError(name, f"must be one-dimensional, got shape {arr.shape}")
        if arr.shape != first.shape:
            raise InvalidInputError(
                name,
                f"has {arr.shape[0]} entries but {first_name} has {first.shape[0]} "
                f"(all observation columns must have one entry per row): {lengths}",
            )
    if first.shape[0] == 0:
        raise InvalidInputError(first_name, "no observations: need at least one row")
    return int(first.shape[0])
