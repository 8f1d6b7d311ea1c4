"""Export pipeline: ONNX, INT8 calibration, TensorRT engines, Triton model repositories
(installed as `vitfast.export`).

onnx, onnxruntime and TensorRT are imported only when a function that needs them runs.
"""

from .artifacts import parse_batch, read_sidecar, sidecar_path
from .onnx_export import to_onnx
from .quantize import quantize_int8
from .tensorrt import TensorRTEngine, build_engine
from .triton_repo import triton_repository

__all__ = ["to_onnx", "quantize_int8", "build_engine", "triton_repository", "TensorRTEngine", "parse_batch", "read_sidecar", "sidecar_path"]
