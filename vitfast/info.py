"""What this machine offers vitfast: library versions, GPU, TensorRT, Triton interpreter mode."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from typing import Any

import torch

from ._version import __version__

# distribution names to try for each library (TensorRT ships under several wheel names)
LIBRARIES = {
    "torch": ("torch",),
    "triton": ("triton",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "openvino": ("openvino",),
    "nncf": ("nncf",),
    "tensorrt": ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_cu12_libs"),
    "transformers": ("transformers",),
    "timm": ("timm",),
    "pytriton": ("nvidia-pytriton",),
}


def library_version(module: str) -> str | None:
    """Installed version of `module`, or None; never imports the module. An imported module says
    its own (torch's `2.11.0+cu130` names the CUDA build; PyPI's wheel metadata says `2.11.0`),
    else the package metadata is read."""
    loaded = sys.modules.get(module)
    if isinstance(getattr(loaded, "__version__", None), str):
        return loaded.__version__
    if importlib.util.find_spec(module) is None:
        return None
    for dist in LIBRARIES.get(module, (module,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def gpu_info() -> dict[str, Any]:
    """GPU name, compute capability, CUDA version; {'available': False} without one."""
    if not torch.cuda.is_available():
        return {"available": False, "name": None, "reason": "no CUDA GPU visible to torch"}
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    return {
        "available": True,
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
    }


def collect() -> dict[str, Any]:
    return {
        "vitfast": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {name: library_version(name) for name in LIBRARIES},
        "gpu": gpu_info(),
        "tensorrt_available": library_version("tensorrt") is not None,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
    }
