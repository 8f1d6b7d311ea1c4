"""argparse types for numeric flags: ASCII digits only, within a range, with the range in the error."""

from __future__ import annotations

import argparse
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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A tolerance: a finite number >= 0 (NaN would pass or fail every comparison)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


positive_int = int_in(1)


def ov_streams(text: str) -> int | str:
    """OpenVINO's NUM_STREAMS: a whole number >= 1, or AUTO."""
    return "AUTO" if text.strip().upper() == "AUTO" else positive_int(text)


port = int_in(1, 65535)
