"""The one place vitfast reaches into PyTriton's private API, behind a version check.

`vitfast serve` replaces each bound model's python-backend `model.py` with `serve_guard.py` (the
per-request checks). PyTriton has no public hook for that: it builds the files in
`Model.get_proxy_model_files`, reached through `Triton._model_manager.models`. This adapter rebinds
that method only on the PyTriton versions it was tested with (`TESTED`, also the range pinned in
pyproject.toml's `serve` extra) and only when the attributes are where it expects them; otherwise it
changes nothing and says why, and serving works with PyTriton's own error texts.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Callable, Iterable

TESTED = ((0, 7), (0, 8))  # nvidia-pytriton >= 0.7, < 0.8
ModelFiles = dict[str, bytes]  # "file:<version>/<name>" -> contents, as PyTriton ships them to Triton


def installed_version() -> tuple[int, ...] | None:
    """nvidia-pytriton's (major, minor, patch), or None when its distribution is not installed."""
    try:
        text = importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def is_tested(version: tuple[int, ...] | None) -> bool:
    """Whether `version` is in the tested range; None (no distribution metadata: a stand-in object) counts as tested."""
    return version is None or TESTED[0] <= version[:2] < TESTED[1]


def rewrite_model_files(triton, model_names: Iterable[str], rewrite: Callable[[ModelFiles, int], ModelFiles],
                        version: tuple[int, ...] | None = None) -> str | None:  # fmt: skip
    """Make each bound model in `model_names` ship `rewrite(files, model_version)` instead of PyTriton's files.

    Call after `triton.bind(...)` and before `triton.run()`. Returns None when done, else the reason
    nothing was changed (an untested PyTriton version, or its internals moved)."""
    version = installed_version() if version is None else version
    if not is_tested(version):
        tested = f"{'.'.join(map(str, TESTED[0]))} to before {'.'.join(map(str, TESTED[1]))}"
        return f"nvidia-pytriton {'.'.join(map(str, version))} is untested (vitfast is tested with {tested})"
    wanted = set(model_names)
    found = [m for m in getattr(getattr(triton, "_model_manager", None), "models", ()) if getattr(m, "model_name", None) in wanted]
    if len(found) != len(wanted) or not all(callable(getattr(m, "get_proxy_model_files", None)) for m in found):
        return "this PyTriton version does not expose its model files"
    for model in found:
        original = model.get_proxy_model_files

        def rewritten(original=original, model_version=model.model_version) -> ModelFiles:
            return rewrite(dict(original()), model_version)

        model.get_proxy_model_files = rewritten
    return None
