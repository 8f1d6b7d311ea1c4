"""TensorRT's entropy calibration threshold: the |x| that loses least information when [0, |x|] is quantized.

The search TensorRT's IInt8EntropyCalibrator2 runs (and NVIDIA's pytorch-quantization `HistogramCalibrator` with
method="entropy" reproduces for Q/DQ graphs): a histogram of |x| in 2048 bins; for each candidate of i bins
(128 <= i <= 2048) the reference P is the first i bins with everything past them folded into the last, and Q is those
i bins merged into 128 levels (int8: 127 levels + sign) and spread back over the bins that were non-empty; the
threshold is the right edge of the i with the smallest KL(P || Q), the largest such i on a tie.

ONNX Runtime's own entropy calibrator differs: it histograms the signed values and merges a candidate [-t, t] into
128 bins in all, 64 levels a side, so on one-sided activations (after ReLU or GELU) it clips far more.
"""

from __future__ import annotations

import numpy as np

LEVELS = 128  # int8's magnitudes: 127 levels + sign, as TensorRT counts them
MAX_BINS = 2048  # TensorRT's histogram size; longer ones (ONNX Runtime grows them as later batches reach further) are merged down
START_BIN = 128


def merged(hist: np.ndarray, edges: np.ndarray, max_bins: int = MAX_BINS) -> tuple[np.ndarray, np.ndarray]:
    """(hist [n], edges [n + 1]) of |x| -> at most `max_bins` bins, each `ceil(n / max_bins)` old ones summed."""
    step = -(-len(hist) // max_bins)
    if step == 1:
        return hist, edges
    padded = np.concatenate([hist, np.zeros(-len(hist) % step, dtype=hist.dtype)])
    width = edges[1] - edges[0]
    sums = padded.reshape(-1, step).sum(axis=1)
    return sums, edges[0] + width * step * np.arange(len(sums) + 1)


def kl_threshold(hist: np.ndarray, edges: np.ndarray) -> float:
    """hist [n] counts of |x| over edges [n + 1] (equal widths, from 0) -> TensorRT's entropy threshold (amax)."""
    hist, edges = merged(np.asarray(hist), np.asarray(edges, dtype=np.float64))
    bins = hist.astype(np.float64)
    if len(bins) < 2:
        return float(edges[-1])
    bins[0] = bins[1]  # the zero bin (ReLU's, padding's) would outweigh everything: TensorRT evens it out first
    if bins.sum() == 0:
        return float(edges[-1])
    best, best_i = np.inf, len(bins)
    for i in range(min(START_BIN, len(bins)), len(bins) + 1):
        kl = _divergence(bins, i)
        if kl <= best:  # the last minimum: the widest range among equals
            best, best_i = kl, i
    return float(edges[best_i])


def _divergence(bins: np.ndarray, i: int) -> float:
    """KL(P || Q) of the candidate keeping the first i bins (see the module docstring)."""
    head = bins[:i]
    reference = head.copy()
    reference[-1] += bins[i:].sum()  # the clipped tail lands on the threshold
    level = np.digitize(np.arange(i), np.linspace(0, i, LEVELS + 1)) - 1
    filled = head != 0
    sums = np.bincount(level[filled], weights=head[filled], minlength=LEVELS)
    counts = np.bincount(level[filled], minlength=LEVELS)
    quantized = np.zeros(i)
    quantized[filled] = (sums / np.maximum(counts, 1))[level[filled]]  # each level's mass spread over its non-empty bins
    p, q = reference / reference.sum(), quantized / quantized.sum()
    where = p > 0
    if np.any(q[where] == 0):
        return np.inf  # P has mass Q cannot express (the folded tail on an empty last bin)
    return float(np.sum(p[where] * np.log(p[where] / q[where])))
