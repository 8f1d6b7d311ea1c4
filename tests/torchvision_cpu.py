"""Lets PyPI's torchvision (a CUDA build) import beside the CPU torch wheel, for the timm tests.

torchvision's C extension (`_C.so`: detection ops such as nms and roi_align) links against
torch's CUDA libraries, so it does not load beside a CPU torch. torchvision then still works for
what timm's models and eval transforms use (its transforms run on PIL images and plain torch
ops), except that importing it fails: `torchvision._meta_registrations` registers fake kernels
for `torchvision::nms` and `torchvision::qnms` without first checking that the extension is
loaded. Declaring those two schemas (no kernel) lets the import through; calling the ops still
raises torchvision's own "Couldn't load custom C++ ops" error. Where the extension loads (a
matching CUDA torch), nothing is declared.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_NMS_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
_declared: list[torch.library.Library] = []  # kept alive: a Library drops its definitions when collected


def allow_import_without_extension() -> None:
    """Declare torchvision's nms/qnms schemas if torchvision is installed but its extension cannot load."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or _declared or not spec.submodule_search_locations:
        return
    extension = Path(spec.submodule_search_locations[0]) / "_C.so"
    if not extension.exists():
        return
    try:
        torch.ops.load_library(str(extension))
    except OSError:  # unresolved libtorch_cuda.so / libc10_cuda.so: a CUDA build beside CPU torch
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define("nms" + _NMS_SCHEMA)
        lib.define("qnms" + _NMS_SCHEMA)
        _declared.append(lib)
