"""Statistics of a benchmark row: percentiles, throughput, roofline fraction, noise, comparisons.

Pure functions on lists of milliseconds, so they are tested on synthetic timings.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from vitfast.errors import ArtifactError

PERCENTILES = (50, 95, 99)
MIN_NOISE = 0.02  # two runs closer than 2% are never called a win or a regression


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between order statistics (numpy's default)."""
    if not len(samples):
        raise ValueError("percentile of no samples")
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / min: how far apart repeated measurements of the same thing landed."""
    lo, hi = min(values), max(values)
    return (hi - lo) / lo if lo > 0 else math.inf


def summarize(repeats: Sequence[Sequence[float]], batch: int, gflops_per_image: float | None) -> dict[str, Any]:
    """Latency statistics over all repeats' samples (ms), throughput and achieved TFLOP/s.

    `spread` compares the medians of the repeats of the same backend: the noise floor of this row.
    """
    samples = [t for rep in repeats for t in rep]
    median = percentile(samples, 50)
    rep_medians = [percentile(rep, 50) for rep in repeats if len(rep)]
    return {
        "n": len(samples),
        "median_ms": median,
        "mean_ms": float(np.mean(samples)),
        "std_ms": float(np.std(samples)),
        "min_ms": float(min(samples)),
        "max_ms": float(max(samples)),
        **{f"p{q}_ms": percentile(samples, q) for q in PERCENTILES},
        "repeat_medians_ms": rep_medians,
        "spread": relative_spread(rep_medians) if len(rep_medians) > 1 else None,
        "images_per_s": batch * 1e3 / median,
        # GFLOP per ms = TFLOP per s; None when the FLOPs are unknown (a foreign graph)
        "tflops": gflops_per_image * batch / median if gflops_per_image is not None else None,
    }


COMPILED_BACKENDS = ("compile", "vitfast-compile")  # the backends --compile-mode applies to


def backend_label(backend: str, compile_mode: str) -> str:
    """A row's backend: a torch.compile backend under a mode other than the default carries it (`compile-max-autotune`,
    as benchmarks/gpu_proof.py labels its rows), so --compare never pairs, nor --report supersedes, rows of two modes."""
    return f"{backend}-{compile_mode}" if backend in COMPILED_BACKENDS and compile_mode != "default" else backend


def row_key(row: dict[str, Any]) -> tuple:
    """What identifies a measurement across files: model, resolution, backend, precision, batch."""
    return (row["model"], row["img_size"], row["backend"], row["precision"], row["batch"])


def verdict(ratio: float, noise: float, floor: float = MIN_NOISE) -> str:
    """'win' / 'regression' when a throughput ratio (new / old) is outside the noise (at least
    `floor`), else 'same'."""
    band = max(noise, floor)
    if ratio > 1 + band:
        return "win"
    if ratio < 1 / (1 + band):
        return "regression"
    return "same"


def compare_rows(base: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], floor: float = MIN_NOISE) -> list[dict[str, Any]]:
    """Row-by-row ratios of `new` over `base` (matched by `row_key`), with a verdict against the noise.

    The noise of a pair is the larger of the two rows' repeat spreads, and at least `floor`: the
    spread only sees noise within a run, so across runs on a shared machine raise the floor. Rows
    measured on one side only, or skipped on either, are listed with their status.
    """
    old, cur = _by_key(base, "base"), _by_key(new, "new")
    out = []
    for key in list(old) + [k for k in cur if k not in old]:
        a, b = old.get(key), cur.get(key)
        entry = dict(zip(("model", "img_size", "backend", "precision", "batch"), key))
        if a is None or b is None or a["status"] != "ok" or b["status"] != "ok":
            entry |= {"status": _pair_status(a, b), "base_ms": _get(a, "median_ms"), "new_ms": _get(b, "median_ms")}
            out.append(entry)
            continue
        noise = max(a["spread"] or 0.0, b["spread"] or 0.0)
        ratio = b["images_per_s"] / a["images_per_s"]
        entry |= {
            "status": "ok",
            "base_ms": a["median_ms"],
            "new_ms": b["median_ms"],
            "latency_ratio": b["median_ms"] / a["median_ms"],
            "throughput_ratio": ratio,
            "p99_ratio": b["p99_ms"] / a["p99_ms"],
            "noise": noise,
            "verdict": verdict(ratio, noise, floor),
        }
        out.append(entry)
    return out


def _by_key(rows: Sequence[dict[str, Any]], side: str) -> dict[tuple, dict[str, Any]]:
    """Rows by `row_key`; two rows with one key cannot be paired, and keeping either would compare the wrong one."""
    out: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        key = row_key(row)
        if out.setdefault(key, row) is not row:
            model, img, backend, precision, batch = key
            raise ArtifactError(f"the {side} result has two rows for {model} at {img}px, {backend} {precision}, batch {batch}, "
                                "which cannot be paired (older vitfast labelled artifacts by file name alone); rerun that sweep")  # fmt: skip
    return out


def _get(row: dict[str, Any] | None, key: str):
    return None if row is None else row.get(key)


def _pair_status(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None:
        return "only in new"
    if b is None:
        return "only in base"
    return f"base {a['status']}, new {b['status']}"
