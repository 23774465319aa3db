"""The batch sizes a conversion offers, and how the runtime fits rows into them (pure Python).

A batched package takes B rows per call for B in its enumerated sizes (`--batch-sizes`,
recorded per package in the manifest; a manifest without them means batch 1 only). The runtime
never asks Core ML for another B: `groups` splits n rows into calls of the largest size, and
pads the last call's rows up to the next size; `require` refuses any other size by name.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from workers.coreml.stages import MAX_BATCH_SIZE, UNBATCHED


def check_batch_sizes(sizes: tuple[int, ...]) -> None:
    """ValueError unless `sizes` start at 1, strictly increase and stay <= MAX_BATCH_SIZE."""
    if (
        not sizes
        or sizes[0] != 1
        or list(sizes) != sorted(set(sizes))
        or sizes[-1] > MAX_BATCH_SIZE
        or not all(isinstance(size, int) for size in sizes)
    ):
        raise ValueError(
            f"batch sizes {','.join(map(str, sizes)) or '(none)'}: strictly increasing integers "
            f"from 1 up to {MAX_BATCH_SIZE}, e.g. 1,2,4,8"
        )


@dataclass(frozen=True)
class Group:
    """One package call: rows[start : start + rows] padded with filler rows up to `size`."""

    start: int
    rows: int
    size: int


@dataclass(frozen=True)
class BatchSizes:
    """The enumerated rows-per-call of one package; (1,) is an unbatched package."""

    sizes: tuple[int, ...] = UNBATCHED

    def __post_init__(self) -> None:
        check_batch_sizes(self.sizes)

    @property
    def batched(self) -> bool:
        return self.sizes != UNBATCHED

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def require(self, size: int, package: str) -> None:
        """ValueError naming the sizes the package has when `size` is not one of them."""
        if size not in self.sizes:
            raise ValueError(
                f"{package}: no batch size {size} in this conversion (it has "
                f"{', '.join(map(str, self.sizes))}); convert with --batch-sizes including it"
            )

    def padded(self, rows: int) -> int:
        """The smallest size holding `rows` (1 <= rows <= largest)."""
        if not 1 <= rows <= self.largest:
            raise ValueError(f"{rows} rows: a call holds 1 to {self.largest}")
        return self.sizes[bisect.bisect_left(self.sizes, rows)]

    def groups(self, rows: int) -> list[Group]:
        """Calls for `rows` rows in order: full calls of the largest size, then the rest
        padded up to the next size (5 rows with sizes 1,2,4 -> 4 + 1)."""
        calls = []
        for start in range(0, rows, self.largest):
            count = min(self.largest, rows - start)
            calls.append(Group(start, count, self.padded(count)))
        return calls
