"""PyTorch reference model -> ONNX (fp32 or fp16), checked, parity-tested, with its sidecar.

The exported graph is the plain-math path (explicit MatMul/Softmax attention, one
`LayerNormalization` node per norm at opset >= 17), with a dynamic batch axis.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import warnings
from pathlib import Path

import torch

from vitfast.data import other_sizes, random_images
from vitfast.errors import ArtifactError, BackendUnavailable, ConfigError, first_line
from vitfast.optimize import restore
from vitfast.parity import compare, with_other_sizes
from vitfast.precision import ONNX, require
from vitfast.progress import Reporter, reporting

from vitfast.atomic import claim_output

from .artifacts import base_metadata, warn_if_parity_failed, write_sidecar

PARITY_BATCH = 4
MIN_OPSET = 17  # LayerNormalization


def require_onnx():
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401 - torch.onnx's exporter imports it half-way through an export
    except ImportError as exc:
        raise BackendUnavailable(f"ONNX export needs onnx, onnxruntime and onnxscript ({exc.name or exc} is missing): "
                                 "pip install 'vitfast[onnx]'") from None  # fmt: skip
    return onnx, onnxruntime


def max_opset() -> int:
    """The newest opset the installed torch exporter, onnx and ONNX Runtime all support."""
    import onnx
    import onnxruntime
    from torch.onnx import _constants  # the exporter's own bound; not public, hence the fallback

    ort_max = 21 if tuple(int(v) for v in onnxruntime.__version__.split(".")[:2]) < (1, 20) else 23
    return min(onnx.defs.onnx_opset_version(), getattr(_constants, "ONNX_MAX_OPSET", 20), ort_max)


def check_finite_weights(model: torch.nn.Module) -> None:
    """Refuse NaN / infinite weights: the export would 'pass' parity with NaN logits on both sides."""
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ArtifactError(f"the model has NaN or infinite weights in {len(bad)} tensor(s) ({', '.join(bad[:3])}"
                            f"{', ...' if len(bad) > 3 else ''}); fix or re-train the checkpoint before exporting")  # fmt: skip


def exportable_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 CPU copy of the reference model on its plain-math path (Triton blocks undone)."""
    if not hasattr(model, "config") or not hasattr(model, "set_fused_attn"):
        raise ConfigError("to_onnx takes a vitfast VisionTransformer (create_model / load_checkpoint)")
    clone = restore(copy.deepcopy(model)).to("cpu", torch.float32).eval()
    return clone.set_fused_attn(False)


def to_onnx(
    model: torch.nn.Module,
    path: str | os.PathLike,
    *,
    opset: int = 18,
    dynamic_batch: bool = True,
    precision: str = "fp32",
    batch: tuple[int, int, int] | None = None,
    force: bool = False,
    source: dict | None = None,
    progress: Reporter | None = None,
) -> Path:
    """Export `model` to ONNX at `path` (+ `path.json` sidecar), atomically; returns `path`.

    precision "fp16" exports the model in float16 with LayerNorm statistics and the attention
    softmax in float32, and float32 inputs/outputs. `batch` (min, opt, max) is recorded for engines built from
    it; with `dynamic_batch=False` the graph is fixed at batch `opt`. A `dynamic_img_size` model gives a graph with
    dynamic H and W (whole patches), its position embeddings resized in the graph. The ONNX Runtime logits are
    compared with the PyTorch fp32 reference on random images (for a dynamic model, at two more sizes:
    `vitfast.data.other_sizes`) and the numbers go in the sidecar.
    `progress`: a `vitfast.progress.Reporter` told each phase (default: silent). A failed parity check keeps the file
    (its sidecar records it) and warns: `vitfast.errors.ParityWarning`.
    """
    onnx, _ = require_onnx()
    newest = max_opset()
    if type(opset) is not int or not MIN_OPSET <= opset <= newest:
        raise ArtifactError(f"--opset must be {MIN_OPSET}..{newest} (LayerNormalization needs {MIN_OPSET}; {newest} is the newest "
                            f"this torch / onnx / onnxruntime can all handle), got {opset!r}")  # fmt: skip
    require(precision, ONNX, "to_onnx", " (int8 goes through quantize_int8)")
    ref = exportable_copy(model)
    check_finite_weights(ref)
    cfg = ref.config
    example_batch = 2 if dynamic_batch else (batch or (1, 1, 1))[1]  # not 1: torch.export specialises size-1 dims
    example = torch.randn(example_batch, cfg.in_chans, *cfg.img_hw)
    graph_module = _Fp16Graph(copy.deepcopy(ref)) if precision == "fp16" else ref
    parity_batch = example_batch if not dynamic_batch else PARITY_BATCH
    report = reporting(progress)
    with claim_output(path, force) as out:
        tmp = out.tmp
        report.phase(f"tracing {precision} ONNX (opset {opset})")
        _export(graph_module, example, tmp, opset, dynamic_batch, cfg.patch_size if cfg.dynamic_img_size else None)
        report.phase(f"checking the graph, parity with PyTorch fp32 on {parity_batch} images")
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except Exception as exc:  # onnx raises ValidationError and friends
            raise ArtifactError(f"the exported ONNX graph failed onnx.checker: {str(exc).splitlines()[0]}") from None
        meta = base_metadata("onnx", cfg, precision, batch=batch, dynamic_batch=dynamic_batch)
        meta["source"] = source
        meta["onnx"] = {"opset": opset, "exporter": f"torch.onnx (dynamo) {torch.__version__}", "dynamic_batch": dynamic_batch,
                        "dynamic_img_size": cfg.dynamic_img_size}  # fmt: skip
        meta["parity"] = with_other_sizes(onnx_parity(tmp, ref, precision, parity_batch),
                                          [onnx_parity(tmp, ref, precision, parity_batch, hw) for hw in other_sizes(cfg)])  # fmt: skip
        write_sidecar(tmp, meta)
    warn_if_parity_failed(path, meta["parity"])
    return Path(path)


def _export(model: torch.nn.Module, example: torch.Tensor, out: Path, opset: int, dynamic_batch: bool, patch: int | None) -> None:
    """`patch`: the graph takes any H x W in whole patches of this size (dynamic_img_size); None: the example's."""
    axes = {0: torch.export.Dim("batch", min=1, max=65536)} if dynamic_batch else {}
    if patch:  # H = patch * rows: the exporter knows the convolution's output grid exactly
        axes |= {2: patch * torch.export.Dim("grid_h", min=1, max=4096), 3: patch * torch.export.Dim("grid_w", min=1, max=4096)}
    dynamic_shapes = {"x": axes} if axes else None
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "torchvision is not installed" and similar exporter chatter
    # onnxscript's version converter logs why it kept a newer opset (with a traceback): kept here, for the error below
    converter, said = logging.getLogger("onnxscript"), _Kept()
    propagate = converter.propagate
    converter.addHandler(said)
    converter.propagate = False
    try:
        with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")  # deprecations inside the exporter; stdout stays clean for --json
            program = torch.onnx.export(
                model, (example,), dynamo=True, opset_version=opset, input_names=["images"],
                output_names=["logits"], dynamic_shapes=dynamic_shapes, verbose=False,
            )  # fmt: skip
            program.save(str(out), external_data=_needs_external_data(model))
    finally:
        quiet.setLevel(level)
        converter.removeHandler(said)
        converter.propagate = propagate
    import onnx

    # torch exports at its own opset and converts down; a failed conversion keeps its opset without raising
    written = next(o.version for o in onnx.load(str(out), load_external_data=False).opset_import if o.domain in ("", "ai.onnx"))
    if written != opset:
        why = "; ".join(dict.fromkeys(said.reasons)) or "torch's exporter did not say why"
        raise ArtifactError(f"this model cannot be expressed at opset {opset} (the exporter kept opset {written}: {why}); "
                            f"use --opset {written}{' or newer' if written > opset else ''}")  # fmt: skip


class _Kept(logging.Handler):
    """Keeps the first line of each exception a logger reports, instead of printing its traceback."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.reasons.append(first_line(record.exc_info[1]))


def _needs_external_data(model: torch.nn.Module) -> bool:
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return nbytes > 1.8 * 2**30  # protobuf files are capped at 2 GiB


class _Fp32LayerNorm(torch.nn.LayerNorm):
    """LayerNorm whose statistics are computed in float32 whatever the weights' dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight.float(), self.bias.float() if self.bias is not None else None
        return torch.nn.functional.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class _Fp16Graph(torch.nn.Module):
    """float32 images in, float32 logits out, float16 inside (LayerNorm statistics and the
    attention softmax stay float32: the softmax through the math path's own upcast)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        for module in model.modules():
            if type(module) is torch.nn.LayerNorm:
                module.__class__ = _Fp32LayerNorm  # same parameters, fp32 statistics
        self.model = model.half()
        self.config = model.config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.half()).float()


def onnx_parity(path: Path, reference: torch.nn.Module, precision: str, batch_size: int, hw: tuple[int, int] | None = None) -> dict:
    """Run the ONNX file on seeded random-pixel images (of img_size, or `hw`) through ONNX Runtime (CPU) vs the fp32 model."""
    import onnxruntime as ort

    images = random_images(reference.config, batch_size, seed=0, hw=hw)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with torch.no_grad():
        expected = reference(images)
    result = compare(torch.from_numpy(out), expected, precision, channel_axis=reference.config.channel_axis)
    return result | {"inputs": f"{batch_size} seeded random-pixel images", "runtime": "onnxruntime CPU", "img_size": list(images.shape[2:])}
