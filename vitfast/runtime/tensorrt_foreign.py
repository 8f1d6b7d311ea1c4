"""What a TensorRT engine another tool built (trtexec, polygraphy, Torch-TensorRT's or ModelOpt's trtexec step) says
about itself, for `TensorRTEngine` to run it without a vitfast sidecar.

An engine records its IO tensors (names, dtypes, shapes, -1 for a dynamic dim) and its optimization profiles, not the
model's preprocessing: that comes from the user (`--config FILE`, e.g. the sidecar of the ONNX it was built from, or
the flags), as for another tool's ONNX graph (`vitfast.foreign`). Nor does it record the version and GPU it was built
for: TensorRT itself refuses a plan from another version or GPU architecture when it deserializes it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from vitfast.errors import ArtifactError, ConfigError
from vitfast.foreign import GraphIO, image_layout, pick_output

FOREIGN_HINT = ("a TensorRT engine runs only under the TensorRT version and on the GPU model that built it, and one without a "
                "vitfast sidecar does not say which: rebuild it on this machine (its trtexec line, or `vitfast export --format trt`)")  # fmt: skip
FLOAT_IO = {"FLOAT": "float32", "HALF": "float16"}  # the input dtypes vitfast feeds
# Words of the "Format/Datatype" strings in the engine inspector's detailed layer listing ("Row major linear FP16
# format", "Thirty-two wide channel vectorized row major Int8 format.", "Float"), coarsest precision first; fp4 is
# judged at int4's tolerances, the loosest vitfast has
LAYER_FORMATS = (("int4", ("int4", "fp4")), ("fp8", ("fp8",)), ("int8", ("int8",)), ("bf16", ("bf16", "bfloat16")), ("fp16", ("fp16", "half")),
                 ("fp32", ("fp32", "float")))  # fmt: skip


def io_tensor_names(trt, engine) -> tuple[list[str], list[str]]:
    """(input names, output names) of an engine's IO tensors, in the engine's order."""
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    return ([n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT],
            [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT])  # fmt: skip


def engine_io(trt, engine, path: Path, output: str | None) -> tuple[GraphIO, tuple[tuple[int, ...], ...]]:
    """(what the engine takes and returns, its first optimization profile's (min, opt, max) input shapes).
    `output`: the output to run, by name; else `vitfast.foreign.pick_output`'s rule (logits, then transformers' names)."""
    inputs, outputs = io_tensor_names(trt, engine)
    if len(inputs) != 1:
        raise ArtifactError(f"{path} has {len(inputs)} inputs ({', '.join(inputs) or 'none'}); vitfast runs image models with one image input")
    name = inputs[0]
    dtype = next((v for k, v in FLOAT_IO.items() if engine.get_tensor_dtype(name) == getattr(trt.DataType, k)), None)
    if dtype is None:
        raise ArtifactError(f"{path}: input {name!r} is {engine.get_tensor_dtype(name)}, not float32/float16; vitfast feeds normalised float images")
    profile = tuple(tuple(int(d) for d in shape) for shape in engine.get_tensor_profile_shape(name, 0))
    # a dim the ONNX left dynamic but the profile pins (min = max: e.g. Optimum's channels and size) is known
    dims = [d if d is not None or lo != hi else lo for d, lo, hi in zip(_dims(engine.get_tensor_shape(name)), profile[0], profile[2])]
    if len(dims) != 4:
        raise ArtifactError(f"{path}: input {name!r} has shape {dims}; expected images [batch, 3, H, W] or [batch, H, W, 3]")
    layout, chans, hw = image_layout(dims, path, name)
    out_name, out_dims, kind, note = pick_output([(n, _dims(engine.get_tensor_shape(n))) for n in outputs], path, 2, output)
    io = GraphIO(name, layout, dtype, dims[0], hw, chans, out_name, "unknown", note, kind, tuple(out_dims[1:]), None)
    return io, profile


def _dims(shape) -> list[int | None]:
    return [int(d) if int(d) >= 0 else None for d in shape]


def profile_batch(io: GraphIO, profile) -> tuple[int, int, int]:
    """(min, opt, max) batch of the profile (a fixed batch N: N, N, N)."""
    return (io.batch,) * 3 if io.batch else tuple(shape[0] for shape in profile)


def check_profile_size(path: Path, io: GraphIO, profile, hw: tuple[int, int]) -> None:
    """Refuse an image size outside the profile of an engine built for a range of sizes."""
    h_axis = 2 if io.layout == "NCHW" else 1
    (h0, w0), (h1, w1) = ((shape[h_axis], shape[h_axis + 1]) for shape in (profile[0], profile[2]))
    if not (h0 <= hw[0] <= h1 and w0 <= hw[1] <= w1):
        raise ConfigError(f"{path} was built for images of {h0}x{w0} to {h1}x{w1} (its TensorRT profile), not {hw[0]}x{hw[1]}: "
                          "pass an --img-size in that range")  # fmt: skip


def built_precision(trt, engine, context) -> str | None:
    """The coarsest precision the engine's layers run in, from its inspector's layer listing, which names each tensor's
    format only for an engine built with detailed profiling verbosity (trtexec --profilingVerbosity=detailed); None
    when it does not. `context` has its input shape set, so the formats of a dynamic-shape engine are resolved."""
    layers = inspected_layers(trt, engine, context)
    return format_precision(" ".join(str(t.get("Format/Datatype", "")) for layer in layers
                                     for t in (*layer.get("Inputs", ()), *layer.get("Outputs", ())) if isinstance(t, dict)))  # fmt: skip


def inspected_layers(trt, engine, context) -> list[dict]:
    """The engine inspector's JSON layer listing ({"Name", "LayerType", "Inputs", "Outputs": [{"Name", "Format/Datatype",
    ...}], ...} per engine layer); [] when the engine has no inspector or its listing is not JSON. `context`, when not
    None, has its input shape set: the inspector names formats only at a known shape."""
    make = getattr(engine, "create_engine_inspector", None)
    if make is None:
        return []
    inspector = make()
    if context is not None:
        inspector.execution_context = context
    try:
        info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    except (TypeError, ValueError):
        return []
    return [layer for layer in info.get("Layers", ()) if isinstance(layer, dict)] if isinstance(info, dict) else []


def format_precision(formats: str) -> str | None:
    """The coarsest precision the inspector's "Format/Datatype" strings name, None when they name none."""
    words = set(re.findall(r"[a-z0-9]+", formats.lower()))  # whole words: "UInt8" is no int8, "BFloat16" no float
    return next((precision for precision, names in LAYER_FORMATS if words & set(names)), None)


def judge_precision(built: str | None) -> tuple[str, str, list[str]]:
    """(precision whose parity tolerances apply, what to call it, warnings) for what `built_precision` read. fp32 formats
    are judged at fp16's tolerances: TensorRT runs fp32 matmuls in TF32 (fp16's 10-bit mantissa) unless the build turned
    it off (--noTF32), which the engine does not record."""
    if built is None:
        return "fp16", "fp16 (assumed)", ["the engine does not record the precision it was built for (only an engine built with "
                                          "trtexec --profilingVerbosity=detailed lists its layers' formats): fp16's parity "
                                          "tolerances assumed"]  # fmt: skip
    if built == "fp32":
        return "fp16", "fp32 or tf32", ["its layers run fp32 formats, but the engine does not record whether TF32 was allowed "
                                        "(TensorRT's and trtexec's default; --noTF32 turns it off): fp16's parity tolerances "
                                        "assumed"]  # fmt: skip
    return built, built, []
