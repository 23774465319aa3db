"""Counts in messages: "1 segment", "2 segments", never "1 segments" or "segment(s)"."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` (with thousands separators) and `noun`, in its plural (`noun` + "s" unless
    given) for every count but 1: `counted(1, "job")` is "1 job", `counted(0, "job")` "0 jobs"."""
    return f"{count:,} {noun if count == 1 else (plural or noun + 's')}"
