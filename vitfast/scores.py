"""The k best classes of each row of logits, with softmax probabilities, sigmoids or the logits themselves
(`vitfast predict`, and the top-k outputs of `vitfast serve`)."""

from __future__ import annotations

import numpy as np

from .errors import InputError

SCORES = ("softmax", "sigmoid", "logits")


def top_classes(logits: np.ndarray, k: int, scores: str = "softmax") -> tuple[np.ndarray, np.ndarray]:
    """(class indices int64 [B, k], their scores float32 [B, k]) of `logits` [B, classes], best first, ties by index;
    k at most the classes. `scores`: "softmax" (probabilities over the classes), "sigmoid" (independent
    probabilities, for multi-label classifiers) or "logits" (the values themselves)."""
    if scores not in SCORES:
        raise InputError(f"scores must be one of {', '.join(SCORES)}, got {scores!r}")
    values = logits.astype(np.float64)
    if scores == "softmax":  # shifted by the row maximum: exp cannot overflow
        values = np.exp(values - values.max(axis=1, keepdims=True))
        values /= values.sum(axis=1, keepdims=True)
    elif scores == "sigmoid":  # the tanh form: no overflow at any logit
        values = 0.5 * (1 + np.tanh(0.5 * values))
    indices = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return indices.astype(np.int64), np.take_along_axis(values, indices, axis=1).astype(np.float32)


def default_scores(num_classes: int, problem_type: str | None) -> tuple[str, str]:
    """(scores, why) for a classifier's logits, by transformers' image-classification pipeline's rule: none for
    regression, a sigmoid per class for a multi-label classifier or a single output, else softmax."""
    if problem_type == "regression":
        return "logits", "the logits themselves (problem_type regression)"
    if problem_type == "multi_label_classification":
        return "sigmoid", "sigmoid per class (problem_type multi_label_classification)"
    if num_classes == 1:
        return "sigmoid", "sigmoid (one output class, as transformers scores it)"
    return "softmax", "softmax over the classes"
