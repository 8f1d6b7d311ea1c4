"""PNGs (`bench --plot`, `inspect`) are written like every other output: whole or not at all, with the
mode the umask gives the JSON beside them (0o644, world-readable, under the usual umask 022)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitfast.bench import report
from vitfast.errors import OutputError

pytest.importorskip("matplotlib", reason="the PNGs need matplotlib (pip install 'vitfast[plot]')")
VITFAST = Path(sys.executable).parent / "vitfast"


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_bench_plot_gets_the_mode_of_the_json_beside_it(tmp_path, umask):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    run = subprocess.run([str(VITFAST), "bench", "--model", "vit_tiny_patch16_224", "--img-size", "32", "--backends", "eager",
                          "--batch", "1", "--repeats", "5", "--warmup", "1", "--out", str(out), "--plot", str(plot)],
                         capture_output=True, text=True, timeout=300, umask=umask)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert mode(plot) == mode(out) == 0o666 & ~umask


def test_inspect_pngs_are_world_readable_under_the_usual_umask(tmp_path):
    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8)).save(image)
    run = subprocess.run([str(VITFAST), "inspect", "--model", "vit_tiny_patch16_224", "--image", str(image), "--out",
                          str(tmp_path / "figs"), "--json"], capture_output=True, text=True, timeout=300, umask=0o022)  # fmt: skip
    assert run.returncode == 0, run.stderr
    files = [Path(p) for p in json.loads(run.stdout)["files"].values()]
    assert len(files) == 4 and {mode(p) for p in files} == {0o644}
    assert mode(tmp_path / "figs") == 0o755


class _HalfWrittenFigure:
    """A figure whose savefig writes part of a PNG, then finds the disk full."""

    def savefig(self, path, **kwargs):
        Path(path).write_bytes(b"\x89PNG\r\n\x1a\n half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_plot_that_fails_half_way_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "build_figure", lambda result: _HalfWrittenFigure())
    path = tmp_path / "plot.png"
    with pytest.raises(OutputError, match="disk is full"):
        report.save_plot({}, path)
    assert list(tmp_path.iterdir()) == []  # neither a truncated PNG nor a staging folder
