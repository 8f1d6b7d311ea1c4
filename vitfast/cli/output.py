"""What the commands print with: a rich console, and tables that fit it."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from rich.console import Console, RenderableType
from rich.measure import Measurement

PIPE_WIDTH = 160  # piped output is read by programs and people with wide windows: rows stay whole


def console() -> Console:
    """A rich console as wide as the terminal; when piped, `PIPE_WIDTH` columns (or $COLUMNS when set),
    so tables keep every column and no value is wrapped or cut."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPE_WIDTH)


def fitting(out: Console, *layouts: RenderableType) -> RenderableType:
    """The first of `layouts` (widest first) that fits `out` without wrapping a cell, else the last:
    the full table on a wide terminal or a pipe, the compact one on 80 columns."""
    for layout in layouts:
        if Measurement.get(out, out.options.update_width(10**6), layout).maximum <= out.width:
            return layout
    return layouts[-1]


def to_json(value: Any) -> str:
    """`json.dumps` of `value` with NaN and inf as null: strict JSON, which Python's bare NaN is not."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return [clean(x) for x in v] if isinstance(v, (list, tuple)) else v

    return json.dumps(clean(value), allow_nan=False)
