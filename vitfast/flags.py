"""argparse types for numeric flags: ASCII digits only, within a range, with the range in the error."""

from __future__ import annotations

import argparse
import math
from typing import Callable

MAX_BATCH = 65536  # the largest batch axis vitfast exports (torch.export's Dim bound in to_onnx)


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse `type`: a whole number in [lo, hi] written in ASCII digits."""
    bounds = f">= {lo}" if hi is None else f"in {lo}..{hi}"

    def parse(text: str) -> int:
        body = text.strip()
        if not (body.lstrip("+-").isascii() and body.lstrip("+-").isdigit()):
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, got {text!r}")
        value = int(body)
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its fallback message
    return parse


def _finite_float(text: str, zero_ok: bool) -> float:
    """A finite number > 0, or >= 0 with `zero_ok` (NaN fails both: it would pass or fail every comparison)."""
    bound = ">= 0" if zero_ok else "> 0"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    return _finite_float(text, zero_ok=False)


def non_negative_float(text: str) -> float:
    """A tolerance: a finite number >= 0."""
    return _finite_float(text, zero_ok=True)


positive_int = int_in(1)


def ov_streams(text: str) -> int | str:
    """OpenVINO's NUM_STREAMS: a whole number >= 1, or AUTO."""
    return "AUTO" if text.strip().upper() == "AUTO" else positive_int(text)


port = int_in(1, 65535)
