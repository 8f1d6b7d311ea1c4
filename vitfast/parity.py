"""Parity numbers between an artifact's logits and the fp32 reference's, with per-precision limits."""

from __future__ import annotations

import torch

# Limits on the relative max error (max |out - ref| / max |ref|) and the worst per-image cosine.
TOLERANCES = {
    "fp32": {"max_rel_err": 1e-4, "cosine": 0.99999},
    "fp16": {"max_rel_err": 2e-2, "cosine": 0.999},
    "bf16": {"max_rel_err": 5e-2, "cosine": 0.995},
    "int8": {"max_rel_err": 0.25, "cosine": 0.97},
    "fp8": {"max_rel_err": 0.25, "cosine": 0.97},
}


def compare(out: torch.Tensor, ref: torch.Tensor, precision: str = "fp32") -> dict:
    """out, ref [B, classes] -> max/mean abs error, max relative error, cosine, top-1 agreement, passed."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if out.shape != ref.shape:
        raise ValueError(f"logits shapes differ: {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    diff = (out - ref).abs()
    cosine = torch.nn.functional.cosine_similarity(out, ref, dim=-1)
    limits = TOLERANCES[precision]
    result = {
        "precision": precision,
        "n": int(out.shape[0]),
        "max_abs_err": diff.max().item(),
        "mean_abs_err": diff.mean().item(),
        "max_rel_err": (diff.max() / ref.abs().max().clamp_min(1e-12)).item(),
        "cosine": cosine.min().item(),
        "top1_agreement": (out.argmax(-1) == ref.argmax(-1)).double().mean().item(),
        "tolerance": limits,
    }
    finite = bool(torch.isfinite(out).all() and torch.isfinite(ref).all())
    if not finite:  # NaN logits make every comparison False and argmax agree by accident: never a pass
        result |= {"max_abs_err": float("nan"), "max_rel_err": float("nan"), "cosine": float("nan"), "top1_agreement": float("nan")}
    result["finite"] = finite
    result["passed"] = finite and result["max_rel_err"] <= limits["max_rel_err"] and result["cosine"] >= limits["cosine"]
    return result
