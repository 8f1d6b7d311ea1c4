"""What the commands print with: a rich console."""

from __future__ import annotations

import sys

from rich.console import Console


def console() -> Console:
    """A rich console; when piped, wide enough that tables are not squeezed into ellipses."""
    return Console() if sys.stdout.isatty() else Console(width=160)
