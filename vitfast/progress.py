"""What long work (export, check, eval) is doing, told to whoever shows it.

Library functions take `progress: Reporter | None` and call it at each phase; None is silent. The
command line (`vitfast.cli.progress`) shows it as a live display on a terminal, or as one plain
line per phase on stderr; library code never prints.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Protocol, TypeVar

T = TypeVar("T")


class Reporter(Protocol):
    def phase(self, text: str) -> None:
        """A step begins, e.g. "tracing ONNX (opset 18)"."""

    def track(self, items: Iterable[T], text: str, *, total: int, size: Callable[[T], int] | None = None) -> Iterable[T]:
        """`items` unchanged, counted as they pass: a step of `total` units (images) that each item
        adds `size(item)` to (default 1), e.g. batches of images."""


class Silent:
    """The default reporter: says nothing."""

    def phase(self, text: str) -> None:
        pass

    def track(self, items: Iterable[T], text: str, *, total: int, size: Callable[[T], int] | None = None) -> Iterable[T]:
        return items


SILENT = Silent()


def reporting(progress: Reporter | None) -> Reporter:
    """`progress`, or the silent reporter for None (and False, which older callers pass)."""
    return progress or SILENT


def counted(items: Iterable[T], size: Callable[[T], int] | None, advance: Callable[[int], None]) -> Iterator[T]:
    """`items` unchanged, calling `advance(size(item))` after each one is used (for reporters with a bar)."""
    for item in items:
        yield item
        advance(size(item) if size else 1)
