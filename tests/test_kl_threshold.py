"""TensorRT's entropy threshold (export/kl_threshold.py) against a plain loop re-derivation of the search, and what it
does that ONNX Runtime's entropy calibrator does not: keep the range of one-sided (post-ReLU) data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vitfast.export.kl_threshold import kl_threshold, merged


def reference_threshold(hist, edges, levels=128, start=128) -> float:
    """The search spelled out bin by bin: P the first i bins with the tail folded into the last; Q those bins merged
    into `levels` equal groups of bins, each group's mass spread evenly over its non-empty bins; the last argmin."""
    bins = [float(v) for v in hist]
    bins[0] = bins[1]
    best, best_i = math.inf, len(bins)
    for i in range(start, len(bins) + 1):
        p = bins[:i]
        p[-1] += sum(bins[i:])
        q = [0.0] * i
        for g in range(levels):
            members = [j for j in range(i) if g * i / levels <= j < (g + 1) * i / levels]
            filled = [j for j in members if bins[j] != 0]
            for j in filled:
                q[j] = sum(bins[k] for k in filled) / len(filled)
        sp, sq = sum(p), sum(q)
        kl = 0.0
        for a, b in zip(p, q):
            if a > 0:
                kl = math.inf if b == 0 else kl + a / sp * math.log((a / sp) / (b / sq))
        if kl <= best:
            best, best_i = kl, i
    return float(edges[best_i])


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_search_spelled_out(seed):
    rng = np.random.default_rng(seed)
    x = np.abs([rng.standard_normal(20_000), rng.laplace(size=20_000), rng.standard_t(3, 20_000), rng.exponential(size=20_000)][seed])
    hist, edges = np.histogram(x, bins=300, range=(0, x.max()))
    hist[rng.integers(0, 300, 20)] = 0  # empty bins, which Q leaves empty
    assert kl_threshold(hist, edges) == reference_threshold(hist, edges)


def test_one_sided_data_keeps_its_range_and_a_heavy_tail_is_clipped():
    rng = np.random.default_rng(0)
    relu = np.maximum(rng.standard_normal(200_000), 0)
    hist, edges = np.histogram(relu, bins=2048, range=(0, relu.max()))
    assert kl_threshold(hist, edges) > 0.85 * relu.max()  # 4.09 of 4.73; ONNX Runtime's signed search: 2.67
    tail = np.abs(rng.standard_t(2, 200_000))
    hist, edges = np.histogram(tail, bins=2048, range=(0, tail.max()))
    assert kl_threshold(hist, edges) < 0.5 * tail.max()


def test_a_histogram_grown_past_2048_bins_is_merged_down():
    hist = np.arange(5000, dtype=np.int64)
    edges = np.linspace(0, 5.0, 5001)
    merged_hist, merged_edges = merged(hist, edges)
    assert len(merged_hist) == 1667 and merged_hist.sum() == hist.sum() and len(merged_edges) == 1668
    assert merged_edges[1] == pytest.approx(3e-3) and merged_edges[-1] >= 5.0
