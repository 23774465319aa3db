"""Argument types the commands share, so a bad value is a usage error (exit 2) naming the rule."""

from __future__ import annotations

import argparse
import math


def seconds(value: str) -> float:
    """A wait in seconds: a finite number, 0 or more (0: do not wait)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"{value} seconds: must be a finite number, 0 or more")
    return number
