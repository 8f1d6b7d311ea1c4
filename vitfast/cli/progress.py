"""Showing `vitfast.progress` reports: a live display on a terminal, one plain line per phase otherwise.

Both go to stderr, so `--json` keeps stdout one JSON object; `--quiet` shows nothing (errors still print).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable, Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

from vitfast.progress import SILENT, Reporter, counted

T = TypeVar("T")


def add_quiet(parser: argparse.ArgumentParser, what: str = "no progress (results and errors still print)") -> None:
    parser.add_argument("--quiet", action="store_true", help=f"print {what}")


@contextlib.contextmanager
def reporter(command: str, quiet: bool = False, console: Console | None = None) -> Iterator[Reporter]:
    """The reporter for `command` ("export", "check", "eval"): silent with `quiet`, a rich display when
    `console` (default: stderr's) is a terminal, else plain "COMMAND: phase" lines on stderr."""
    if quiet:
        yield SILENT
        return
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield PlainReporter(command)
        return
    # the description wraps on a narrow terminal, so the counts and the time always show whole
    display = Progress(SpinnerColumn(), TextColumn("{task.description}", table_column=Column(no_wrap=False)), BarColumn(bar_width=20),
                       _Count(), TimeElapsedColumn(), console=console, transient=True)  # fmt: skip
    try:
        yield RichReporter(command, display)
    finally:
        display.stop()  # clears the display (transient); nothing if it never started


@contextlib.contextmanager
def paused(progress: Reporter) -> Iterator[None]:
    """Take a terminal's live display down meanwhile (for a library's own bar, e.g. TensorRT's builder)."""
    if not isinstance(progress, RichReporter):
        yield
        return
    progress.display.stop()
    try:
        yield
    finally:
        progress.display.start()


class PlainReporter:
    """One line per phase on stderr, e.g. "export: tracing ONNX (opset 18)"; a tracked step is one phase."""

    def __init__(self, command: str):
        self.command = command

    def phase(self, text: str) -> None:
        print(f"{self.command}: {text}", file=sys.stderr, flush=True)

    def track(self, items: Iterable[T], text: str, *, total: int, size: Callable[[T], int] | None = None) -> Iterable[T]:
        self.phase(text)
        return items


class RichReporter:
    """The current phase with a spinner and its elapsed time; a tracked step as a bar with counts. The display
    starts with the first phase, so a command that fails before any work draws nothing."""

    def __init__(self, command: str, display: Progress):
        self.command, self.display = command, display
        self.current = None  # the spinner task of the phase running now

    def phase(self, text: str) -> None:
        self._end_phase()
        self.display.start()
        self.current = self.display.add_task(f"{self.command}: {text}", total=None)

    def track(self, items: Iterable[T], text: str, *, total: int, size: Callable[[T], int] | None = None) -> Iterable[T]:
        self._end_phase()
        self.display.start()
        self.current = self.display.add_task(f"{self.command}: {text}", total=total)
        return counted(items, size, lambda n, task=self.current: self.display.advance(task, n))

    def _end_phase(self) -> None:
        if self.current is not None:
            self.display.remove_task(self.current)
            self.current = None


class _Count(MofNCompleteColumn):
    """"12/64" for a step with a total, nothing for a phase without one (rich would show "0/?")."""

    def render(self, task) -> Text:
        return super().render(task) if task.total is not None else Text("")
