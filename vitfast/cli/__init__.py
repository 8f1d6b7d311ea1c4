"""`vitfast` command line, the top floor: argparse, printing and exit codes, one module per command group.

Library modules (`vitfast.pipeline`, `vitfast.bench`, `vitfast.serve`, `vitfast.export`, ...) never
import from here; the commands call them with typed arguments.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
