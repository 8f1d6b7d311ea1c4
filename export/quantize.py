"""INT8 post-training quantization of an exported fp32 ONNX model with ONNX Runtime's calibrators.

Three targets from one calibration:
- "tensorrt" (default): explicit QDQ that TensorRT builds INT8 engines from: symmetric int8
  activations and weights (zero point 0), per-channel weights, Q/DQ only on the inputs of every
  Conv (the patch embedding's; in hybrid models also each ResNet stem convolution) and MatMul/Gemm
  layer; LayerNorm, Softmax, GELU (and a hybrid stem's norms) stay float.
- "openvino": the same Q/DQ placement on a graph whose attention computes q, k and v with three
  MatMuls (`qkv_split.py`): the fastest int8 file for OpenVINO on CPU (benchmarks/cpu_runtimes.py),
  slower than "tensorrt" in ONNX Runtime.
- "cpu": the form ONNX Runtime's CPU int8 kernels want on x86 (VNNI multiplies uint8 x int8):
  asymmetric uint8 activations, symmetric per-channel int8 weights, same layers.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import numbers
import os
import random
import tempfile
import traceback
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from vitfast.config import ViTConfig
from vitfast.data import batches, find_images, other_sizes, random_images
from vitfast.errors import ArtifactError, InputError, describe_exception
from vitfast.parity import compare, with_other_sizes
from vitfast.progress import Reporter, reporting

from vitfast.atomic import claim_output, temporaries_in

from .artifacts import made_from, read_sidecar, warn_if_parity_failed, write_sidecar
from .int8_sensitivity import quantized_layers, rank_layers
from .kl_threshold import kl_threshold
from .onnx_export import require_onnx
from .qkv_split import write_split_qkv
from .scopes import keep_scopes, module_paths, node_scopes

METHODS = ("minmax", "entropy", "percentile")
TARGETS = ("tensorrt", "openvino", "cpu")
QUANTIZED_OPS = ["Conv", "MatMul", "Gemm"]
HYBRID_STEM = "patch_embed.backbone.*"  # the module paths of a hybrid's ResNet stem, for exclude
HELD_OUT = 64  # images the int8 parity is measured on, never calibrated on
SENSITIVITY_IMAGES = 16  # calibration images keep_float ranks the layers on (one ONNX Runtime run per layer each)
# ONNX Runtime's calibrator settings per method, recorded in the sidecar. quantize_static cannot pass the bin counts: its
# entropy calibration histograms into 128 bins and quantizes to 128, so the KL search has one candidate, the full range.
CALIBRATOR_OPTIONS = {
    "minmax": {"moving_average": False},  # the min and max over all images, not a mean of per-batch extremes
    # TensorRT's KL search (kl_threshold.py) on ONNX Runtime's histograms of |x|; ONNX Runtime's own entropy calibrator
    # merges signed values into 64 levels a side and clips one-sided (post-ReLU / GELU) data far more (relu(N(0, 1)):
    # 2.71 of max 4.32, where TensorRT's search keeps 4.32)
    "entropy": {"num_bins": 2048, "num_quantized_bins": 128, "search": "tensorrt"},
    "percentile": {"num_bins": 2048},  # what quantize_static gives it; `percentile` is added
}


def split_calibration(source, config, *, samples: int, batch_size: int = 16) -> tuple[list[np.ndarray], np.ndarray]:
    """(calibration batches [b, C, H, W], held-out images [n, C, H, W]) as float32 arrays, from an
    image folder (searched recursively, shuffled with a fixed seed, preprocessed with the model's
    own settings) or from tensors / an iterable of batches. The held-out images, on which the int8
    parity is measured, are never calibrated on: up to `HELD_OUT` beyond the first `samples`, or,
    when there are no more, a fifth of them (at most `HELD_OUT`) taken out of the calibration set."""
    if type(samples) is not int or samples < 1:
        raise InputError(f"samples must be a whole number >= 1, got {samples!r}")
    if isinstance(source, (str, os.PathLike)):
        calib_files, held_files = calibration_files(source, samples)
        held = torch.cat(list(batches(held_files, config, batch_size))).numpy()
        return [b.numpy() for b in batches(calib_files, config, batch_size)], held
    if isinstance(source, torch.Tensor):
        source = source.split(batch_size) if source.ndim else [source]
    elif isinstance(source, np.ndarray) or not hasattr(source, "__iter__"):
        source = [source]
    out, seen = [], 0
    for item in source:
        arr = _calibration_array(item, config)
        out.append(arr[: samples + HELD_OUT - seen])
        seen += len(out[-1])
        if seen >= samples + HELD_OUT:
            break
    if not out:
        raise InputError("no calibration data: give an image folder, a tensor or an iterable of batches")
    calib, held = _split(np.concatenate(out), samples)
    return [calib[i : i + batch_size] for i in range(0, len(calib), batch_size)], held


def calibration_files(folder: str | os.PathLike, samples: int) -> tuple[list[Path], list[Path]]:
    """(calibration files, held-out files) that `split_calibration` takes from the image folder `folder`."""
    files = find_images(folder)
    random.Random(0).shuffle(files)  # a sample of every class, not the first folders in sorted order
    return _split(files, samples)


def _split(items, samples: int):
    """(calibration items, held-out items)."""
    if len(items) > samples:
        return items[:samples], items[samples : samples + HELD_OUT]
    if len(items) < 2:
        raise InputError(f"int8 calibration needs at least 2 images (one is held out to measure parity), got {len(items)}")
    n_held = min(HELD_OUT, max(1, len(items) // 5))
    return items[n_held:], items[:n_held]


def _calibration_array(item, config) -> np.ndarray:
    """One calibration batch as float32 [b, C, H, W], or an InputError saying what is wrong with it."""
    h, w = config.img_hw
    expected = f"normalised float images [B, {config.in_chans}, {h}, {w}]"
    if isinstance(item, torch.Tensor):
        item = item.detach().cpu()
        item = item.float() if item.is_floating_point() else item  # numpy has no bfloat16
    try:
        arr = np.asarray(item)
        dtype = arr.dtype
        arr = arr.astype(np.float32)
    except (TypeError, ValueError):
        raise InputError(f"calibration data must be {expected}, got a {type(item).__name__}") from None
    if dtype.kind in "biu":  # raw pixels: calibrated (and their parity measured) on the wrong scale
        raise InputError(f"calibration data must be {expected}, got {dtype} values; turn uint8 images [B, H, W, C] or "
                         "PIL images into them with vitfast.preprocess(images, config), or give an image folder")  # fmt: skip
    if arr.ndim != 4 or arr.shape[1:] != (config.in_chans, h, w) or len(arr) == 0:
        raise InputError(f"calibration data must be {expected}, got shape {tuple(arr.shape)}")
    if not np.isfinite(arr).all():
        raise InputError("calibration data holds NaN or infinite values: the int8 scales would be meaningless; give finite images")
    lo, hi = pixel_range(config)
    if np.abs(arr).max() > PIXEL_RANGE_MARGIN * max(-lo, hi):  # e.g. float pixels on the 0..255 scale, parity measured on them too
        raise InputError(f"calibration data holds values from {arr.min():.4g} to {arr.max():.4g}, far beyond the {lo:.3g}..{hi:.3g} "
                         "the model's preprocessing makes of 8-bit images (pixels on the 0..255 scale?); normalise them as the "
                         "model's preprocessing does: vitfast.preprocess(uint8 images [B, H, W, C], config), or give an image folder")  # fmt: skip
    return arr


# How far past the normalised 8-bit range calibration values may go: N(0, 1) test tensors and synthetic outliers stay
# inside; images on the 0..255 scale do not, unless nearly black.
PIXEL_RANGE_MARGIN = 8


def pixel_range(config) -> tuple[float, float]:
    """(lowest, highest) value the model's normalisation (x - mean) / std gives pixels in [0, 1], over the channels."""
    return min(-m / s for m, s in zip(config.mean, config.std)), max((1 - m) / s for m, s in zip(config.mean, config.std))


def _reader(batches: Iterable[np.ndarray]):
    """ONNX Runtime's calibration data reader over `batches` of images."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(batches)

        def get_next(self):
            batch = next(self.items, None)
            return None if batch is None else {"images": batch}

    return Reader()


def calibrate(prepared: Path, data: list[np.ndarray], method: str, options: dict, workdir: Path, large: bool,
              report) -> dict[str, list[dict]]:  # fmt: skip
    """Each calibrated activation's range from ONNX Runtime's `method` calibrator with `options`, in the form of
    quantize_static's TensorQuantOverrides. `report`: told the images calibrated so far."""
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    # entropy: the percentile calibrator's histograms of |x| (symmetric), searched as TensorRT does (kl_threshold.py)
    calibrator = create_calibrator(
        prepared, QUANTIZED_OPS, augmented_model_path=str(workdir / "augmented.onnx"),
        calibrate_method={"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Percentile,
                          "percentile": CalibrationMethod.Percentile}[method],
        use_external_data_format=large,
        extra_options={"num_bins": options["num_bins"], "symmetric": True} if method == "entropy" else options,
    )  # fmt: skip
    n = sum(len(b) for b in data)
    with contextlib.redirect_stdout(io.StringIO()):  # the histogram calibrators print every step; stdout stays clean for --json
        for batch in report.track(data, f"calibrating int8 ({method}) on {n} images", total=n, size=len):
            # one batch a call: ONNX Runtime merges the ranges / histograms, so memory holds one batch's activations
            calibrator.collect_data(_reader([batch]))
        if method == "entropy":
            return {name: [_kl_range(*histogram[:4])] for name, histogram in calibrator.collector.histogram_dict.items()}
        ranges = calibrator.compute_data()
    return {name: [{"rmin": td.range_value[0], "rmax": td.range_value[1]}] for name, td in ranges.data.items()}


def _kl_range(hist: np.ndarray, edges: np.ndarray, low, high) -> dict:
    """A tensor's range from TensorRT's entropy threshold on its |x| histogram, within the values seen (low, high), as
    ONNX Runtime bounds its percentile ranges."""
    amax = np.float32(kl_threshold(hist, edges))
    return {"rmin": np.maximum(-amax, np.float32(low)), "rmax": np.minimum(amax, np.float32(high))}


def nodes_to_exclude(model_path: Path, patterns: Iterable[str], modules: dict[str, str]) -> list[str]:
    """Names of the nodes whose name, or the module path it was exported from (`modules`: {node name: module path},
    `scopes.module_paths`), matches any shell-style pattern (e.g. 'node_Conv_2*', '*attn*' or 'patch_embed.backbone.*')."""
    import onnx

    patterns = list(patterns)
    if not patterns:
        return []
    names = [n.name for n in onnx.load(str(model_path), load_external_data=False).graph.node]
    hit = {p: [n for n in names if fnmatch.fnmatch(n, p) or fnmatch.fnmatch(modules.get(n, ""), p)] for p in patterns}
    unmatched = [p for p in patterns if not hit[p]]
    if unmatched:
        paths = [m for m in dict.fromkeys(modules.values()) if not m.startswith("_")]  # not the exporter's own hooks
        raise ArtifactError(f"exclude pattern(s) {unmatched} match no node name or module path; node names look like {names[:3]}"
                            + (f", module paths like {paths[:3]}" if paths else ""))  # fmt: skip
    return [n for n in names if any(n in hit[p] for p in patterns)]


EXTERNAL_DATA_BYTES = 1.8 * 2**30  # graphs this large keep their weights in an external file: protobuf caps a file at 2 GiB


def stored_bytes(path: Path) -> int:
    """The bytes of the ONNX graph at `path` with the external weights files it names."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    files = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    return path.stat().st_size + sum((path.parent / f).stat().st_size for f in files)


def _prepare_for_quantization(source: Path, prepared: Path, large: bool) -> str:
    """ONNX Runtime's pre-processing for quantization (shape inference, graph clean-up) of `source`
    into `prepared`; returns the shape inference used, for the sidecar. ONNX Runtime's symbolic
    shape inference comes first: it follows the dynamic batch through the graph. Some ONNX Runtime
    releases fail inside it on the dynamic-shape Concat of torch's exporter (1.30: an IndexError
    in _infer_Concat; fixed by 1.32); then ONNX's own shape inference is used, which quantizes to
    the same Q/DQ placement, and the sidecar says so. `large`: write the weights to an external file (over 2 GiB)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process  # lazy: onnxruntime is the [onnx] extra

    source, prepared = source.resolve(), prepared.resolve()
    external = {"save_as_external_data": True, "all_tensors_to_one_file": True, "external_data_location": f"{prepared.name}.data"} if large else {}
    try:
        # When its inference is incomplete, ONNX Runtime saves the half-inferred graph as sym_shape_infer_temp.onnx
        # (+ a .data file) in the working directory before raising: run it in a scratch one, so nothing lands in the user's.
        with tempfile.TemporaryDirectory(prefix="vitfast-shapes-") as scratch, contextlib.chdir(scratch):
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=False, **external)
        return "onnxruntime symbolic"
    except Exception as exc:  # noqa: BLE001 - only failures inside the symbolic inference are retried
        frames = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
        if not any(name.endswith("symbolic_shape_infer.py") for name in frames):
            raise
        reason = describe_exception(exc)
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True, **external)
    return f"onnx (ONNX Runtime's symbolic shape inference failed with {reason})"


def quantize_int8(
    onnx_path: str | os.PathLike,
    out_path: str | os.PathLike,
    calibration,
    *,
    method: str = "minmax",
    samples: int = 256,
    target: str = "tensorrt",
    exclude: Iterable[str] = (),
    keep_float: int = 0,
    percentile: float = 99.999,
    force: bool = False,
    intermediate: bool = False,
    progress: Reporter | None = None,
) -> Path:
    """fp32 ONNX (with sidecar) -> INT8 QDQ ONNX (+ sidecar with calibration and parity numbers).
    `calibration`: an image folder, or float images as the model takes them ([B, C, H, W], normalised:
    `vitfast.preprocess`'s output) in a tensor, an array or an iterable of batches; integer pixels, and floats far past
    what normalised 8-bit pixels reach (0..255 floats), are refused.
    `method`: each activation's range from ONNX Runtime's calibrator: "minmax" the smallest and largest value over
    all calibration images (whatever their batching or order); "entropy" TensorRT's KL-divergence threshold
    (IInt8EntropyCalibrator2's search: a 2048-bin histogram of |x|, candidates merged into 128 levels; `kl_threshold`)
    on ONNX Runtime's histograms; "percentile"
    the `percentile`th percentile of the absolute values (2048 bins). The sidecar's `int8.calibrator` says which ran.
    `exclude`: shell-style patterns of the nodes kept in float, by node name or by the module path a node was exported
    from ('patch_embed.backbone.*': a hybrid's ResNet stem). `keep_float`: also keep the n quantized layers in float whose
    quantization costs the most (`int8_sensitivity.rank_layers` on calibration images; recorded in the sidecar).
    `intermediate`: `onnx_path` is the caller's temporary, not kept; the sidecar records it by its sha256 alone.
    `progress`: a `vitfast.progress.Reporter` told each phase and the images calibrated so far (default: silent).
    An int8 parity that fails keeps the file (its sidecar records it) and warns: `vitfast.errors.ParityWarning`."""
    require_onnx()
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if method not in METHODS:
        raise ArtifactError(f"calibration method must be one of {METHODS}, got {method!r}")
    if target not in TARGETS:
        raise ArtifactError(f"int8 target must be one of {TARGETS}, got {target!r}")
    if type(keep_float) is not int or keep_float < 0:
        raise InputError(f"keep_float must be a whole number >= 0 (quantized layers kept in float), got {keep_float!r}")
    if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real) or not 0 < percentile <= 100:
        raise InputError(f"percentile must be a number in (0, 100], the share of each activation's absolute values its int8 "
                         f"range covers (default 99.999), got {percentile!r}")  # fmt: skip
    onnx_path = Path(onnx_path)
    if Path(out_path).resolve() == onnx_path.resolve():  # force=True replaced the fp32 graph, and quantized_from named itself
        raise ArtifactError(f"{out_path} is the fp32 graph being quantized; write the int8 file to another path")
    meta = read_sidecar(onnx_path)
    if meta.get("precision") != "fp32":
        raise ArtifactError(f"{onnx_path} is {meta.get('precision')}; quantize an fp32 ONNX export")
    config = ViTConfig.from_dict(meta["config"])
    exclude, scopes = list(exclude), node_scopes(onnx_path)
    modules = module_paths(scopes)
    nodes_to_exclude(onnx_path, exclude, modules)  # a typo is told now, not after the calibration
    data, held_out = split_calibration(calibration, config, samples=samples)
    n_samples = sum(len(b) for b in data)
    report = reporting(progress)
    calibrator_options = CALIBRATOR_OPTIONS[method] | ({"percentile": percentile} if method == "percentile" else {})
    symmetric_acts = target != "cpu"
    extra = {
        "ActivationSymmetric": symmetric_acts,
        "WeightSymmetric": True,
        "QuantizeBias": not symmetric_acts,  # TensorRT takes int8 Q/DQ only: biases stay float
        # Q/DQ on the inputs of the matrix products only: their outputs (and so Softmax, LayerNorm
        # and GELU) stay float, which is where TensorRT wants the boundaries.
        "OpTypesToExcludeOutputQuantization": QUANTIZED_OPS if symmetric_acts else [],
    }
    with claim_output(out_path, force) as out, temporaries_in(out.scratch_dir):  # ONNX Runtime's temporaries too: off /tmp
        tmp, prepared, source = out.tmp, out.scratch_dir / "prepared.onnx", onnx_path
        if target == "openvino":
            report.phase("splitting q/k/v in the graph")
            source = out.scratch_dir / "split_qkv.onnx"
            split_blocks = write_split_qkv(onnx_path, source, config.num_heads)
        report.phase("preparing the graph for quantization (shape inference)")
        large = stored_bytes(source) > EXTERNAL_DATA_BYTES
        shape_inference = _prepare_for_quantization(source, prepared, large)
        extra["TensorQuantOverrides"] = calibrate(prepared, data, method, calibrator_options, out.scratch_dir, large, report)

        def quantize(excluded: list[str]) -> None:
            tmp.with_name(f"{tmp.name}.data").unlink(missing_ok=True)  # onnx appends external weights to an existing file
            quantize_static(
                # quantize_static calibrates too (min/max by default; a batch will do): the overrides replace every range it finds
                str(prepared), str(tmp), _reader(data[:1]),
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QInt8 if symmetric_acts else QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=QUANTIZED_OPS,
                nodes_to_exclude=excluded,
                extra_options=extra,
                use_external_data_format=large,
            )  # fmt: skip
            keep_scopes(tmp, scopes)

        if source != onnx_path:  # the split-qkv graph's new nodes
            scopes |= node_scopes(source)
            modules = module_paths(scopes)
        excluded = nodes_to_exclude(prepared, exclude, modules)  # preparing drops the module paths: read from the source
        quantize(excluded)
        kept = None
        if keep_float:
            n_layers = len(quantized_layers(onnx.load(str(tmp), load_external_data=False).graph, QUANTIZED_OPS))
            if keep_float > n_layers:  # told before the sweep, which runs the graph once per layer
                raise InputError(f"keep_float={keep_float} but the graph has {n_layers} quantized layers; keep fewer")
            sample = np.concatenate(data)[:SENSITIVITY_IMAGES]
            workdir = out.scratch_dir / "sensitivity"
            workdir.mkdir()
            ranked = rank_layers(tmp, prepared, sample, QUANTIZED_OPS, workdir=workdir, modules=modules, progress=progress)
            kept = {"nodes": [s.node for s in ranked[:keep_float]], "ranked_on": f"{len(sample)} calibration images",
                    "ranking": [{"node": s.node, "module": s.module, "error_left": s.error_left} for s in ranked[: max(keep_float, 10)]]}  # fmt: skip
            report.phase(f"quantizing again with the {keep_float} most sensitive layer(s) in float")
            quantize(excluded + [n for n in kept["nodes"] if n not in excluded])
        report.phase(f"int8 parity with the fp32 ONNX on {len(held_out)} held-out images")
        new_meta = dict(meta)
        new_meta.update(
            kind="onnx", precision="int8",  # "source" stays the model the fp32 ONNX came from
            quantized_from=made_from(onnx_path, intermediate=intermediate),
            int8={"target": target, "method": method, "calibrator": calibrator_options, "samples": n_samples, "held_out": len(held_out),
                  "per_channel_weights": True,
                  "symmetric_activations": symmetric_acts, "quantized_ops": QUANTIZED_OPS, "exclude": list(exclude),
                  "keep_float": kept,
                  "shape_inference": shape_inference,
                  "calibration": str(calibration) if isinstance(calibration, (str, os.PathLike)) else "tensors"}
                 | ({"split_qkv_blocks": split_blocks} if target == "openvino" else {}),
            parity=with_other_sizes(_int8_parity(tmp, onnx_path, held_out, config.channel_axis),
                                    [_int8_parity(tmp, onnx_path, random_images(config, 4, seed=0, hw=hw).numpy(), config.channel_axis,
                                                  "4 seeded random-pixel images") for hw in other_sizes(config)]),
        )  # fmt: skip
        if not new_meta["parity"]["passed"] and config.hybrid_layers is not None and HYBRID_STEM not in exclude:
            new_meta["parity"]["advice"] = (f"a hybrid's ResNet stem can amplify int8 error (GroupNorm scales up what its standardised "
                                            f"convs leave); keep it float with --exclude '{HYBRID_STEM}' (exclude=['{HYBRID_STEM}'])")  # fmt: skip
        write_sidecar(tmp, new_meta)
    warn_if_parity_failed(out_path, new_meta["parity"])
    return Path(out_path)


def _int8_parity(int8_path: Path, fp32_path: Path, images: np.ndarray, channel_axis: int,
                 inputs: str = "held-out images (not used for calibration)") -> dict:  # fmt: skip
    """int8 vs fp32 ONNX logits on `images` (by default the held-out ones, none of them calibrated on)."""
    import onnxruntime as ort

    outs = []
    for path in (int8_path, fp32_path):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outs.append(torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images})[0]))
    return compare(outs[0], outs[1], "int8", channel_axis=channel_axis) | {"inputs": f"{len(images)} {inputs}", "reference": "fp32 ONNX",
                                                                            "img_size": list(images.shape[2:])}  # fmt: skip
