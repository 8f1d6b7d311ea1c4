"""Parity numbers between an artifact's logits and the fp32 reference's, with per-precision limits."""

from __future__ import annotations

import torch

from .precision import TOLERANCES

# Rows narrower than this (a regression output, a single-logit or few-class head) get one cosine over the whole batch:
# a row of one element has no direction, only a sign, and a short row can sit near zero for an image, where an error far
# inside the max_abs_err limit turns it around (cosine -1 for a regression output of 0.01 read as -0.01).
MIN_ROW_COSINE = 8


def looser_precision(a: str, b: str) -> str:
    """Of two precisions, the one with the wider tolerance (what comparing the two can promise)."""
    return max(a, b, key=lambda p: TOLERANCES[p]["max_rel_err"])


def tolerance(precision: str, ref_scale: float, atol: float | None = None, rtol: float | None = None) -> dict:
    """The limits at `precision`: max |out - ref| <= atol + rtol * ref_scale (ref_scale = max |ref|),
    and cosine >= the precision's limit. atol defaults to 0 and rtol to the precision's relative limit."""
    limits = TOLERANCES[precision]
    atol = 0.0 if atol is None else atol
    rtol = limits["max_rel_err"] if rtol is None else rtol
    return {"atol": atol, "rtol": rtol, "max_rel_err": rtol, "cosine": limits["cosine"], "limit_abs_err": atol + rtol * ref_scale}


def with_other_sizes(result: dict, others: list[dict]) -> dict:
    """A parity result at img_size with those at other image sizes (each `compare`'s, with its `img_size`) under
    "other_sizes": passed only if every size passed (a dynamic_img_size artifact)."""
    if not others:
        return result
    return result | {"other_sizes": others, "passed": result["passed"] and all(o["passed"] for o in others)}


def failure(parity: dict | None) -> str | None:
    """'parity FAILED: ...' with the numbers and limits of each image size that failed, or None when `parity` (a
    `compare` or `with_other_sizes` result, as sidecars record it) passed or was not measured."""
    if not parity or parity.get("passed") is not False:
        return None
    sizes = [parity, *parity.get("other_sizes", ())]
    # `passed` at the top covers every size (`with_other_sizes`): each size's own verdict is read off its numbers (NaN fails)
    failed = [r for r in sizes if not (r["max_abs_err"] <= r["tolerance"]["limit_abs_err"] and r["cosine"] >= r["tolerance"]["cosine"])]
    return "parity FAILED: " + "; ".join(
        (f"at {'x'.join(map(str, r['img_size']))}: " if len(sizes) > 1 and "img_size" in r else "")
        + f"max_abs_err {r['max_abs_err']:.3g} (limit {r['tolerance']['limit_abs_err']:.3g}), "
          f"cosine {r['cosine']:.6f} (limit {r['tolerance']['cosine']})" for r in failed)  # fmt: skip


def find_the_layer(path) -> str:
    """How to find where an artifact at `path` departs from its reference: `check --mark-all` compares two ONNX graphs."""
    if str(path).lower().endswith(".onnx"):
        return (f"`vitfast check {path} --against OTHER.onnx --mark-all` (OTHER an fp32 export of the same model) names the first "
                "layer out of tolerance")  # fmt: skip
    return (f"`vitfast check {path} --against OTHER` compares it with another export, and `--mark-all` between an ONNX export at its "
            "precision and an fp32 one names the first layer out of tolerance")  # fmt: skip


def failed_export(path, parity: dict | None) -> str | None:
    """The one line saying that the export written to `path` failed its parity check (None if it passed): the numbers, that
    the artifact is kept for inspection with the failure in its sidecar, how to find the layer at fault, and the parity's
    `advice` where the exporter recorded one."""
    failed = failure(parity)
    advice = f"; {parity['advice']}" if failed and parity.get("advice") else ""  # what the exporter knows may help (int8 hybrids)
    return failed and f"{failed}; {path} is kept for inspection, its sidecar records the failure: {find_the_layer(path)}{advice}"


def compare(out: torch.Tensor, ref: torch.Tensor, precision: str = "fp32", *, atol: float | None = None,
            rtol: float | None = None, channel_axis: int = -1) -> dict:  # fmt: skip
    """out, ref [B, classes] (or [B, tokens, features], or feature maps whose features lie on `channel_axis`:
    `ViTConfig.channel_axis`) -> max/mean abs error, max relative error, cosine, top-1 agreement (per row, per
    token or position when there are many: the worst cosine, the mean agreement), passed. Rows of fewer than
    `MIN_ROW_COSINE` values get one cosine over the whole batch instead ("cosine_over": "batch", else "row")."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if out.shape != ref.shape:
        raise ValueError(f"logits shapes differ: {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    out, ref = out.movedim(channel_axis, -1), ref.movedim(channel_axis, -1)
    diff = (out - ref).abs()
    cosine_over = "row" if out.shape[-1] >= MIN_ROW_COSINE else "batch"
    rows_out, rows_ref = (out, ref) if cosine_over == "row" else (out.reshape(1, -1), ref.reshape(1, -1))
    # rows equal to the last bit (two all-zero outputs, whose cosine would be 0) agree perfectly
    cosine = torch.nn.functional.cosine_similarity(rows_out, rows_ref, dim=-1).where((rows_out != rows_ref).any(dim=-1), 1.0)
    scale = ref.abs().max().item()
    limits = tolerance(precision, scale, atol, rtol)
    result = {
        "precision": precision,
        "n": int(out.shape[0]),
        "max_abs_err": diff.max().item(),
        "mean_abs_err": diff.mean().item(),
        "max_rel_err": diff.max().item() / max(scale, 1e-12),
        "cosine": cosine.min().item(),
        "cosine_over": cosine_over,
        "top1_agreement": (out.argmax(-1) == ref.argmax(-1)).double().mean().item(),
        "tolerance": limits,
    }
    finite = bool(torch.isfinite(out).all() and torch.isfinite(ref).all())
    if not finite:  # NaN logits make every comparison False and argmax agree by accident: never a pass
        result |= {"max_abs_err": float("nan"), "max_rel_err": float("nan"), "cosine": float("nan"), "top1_agreement": float("nan")}
    result["finite"] = finite
    result["passed"] = finite and result["max_abs_err"] <= limits["limit_abs_err"] and result["cosine"] >= limits["cosine"]
    return result
