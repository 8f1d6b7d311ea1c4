"""Helpers shared by the kernel launchers."""

from __future__ import annotations

import os

import torch

# Read once, like triton itself: TRITON_INTERPRET must be set before triton is imported.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def next_pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def check_device(*tensors: torch.Tensor) -> None:
    """All on one device: CUDA, or CPU under the Triton interpreter."""
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError(f"all tensors must be on one device, got {[str(t.device) for t in tensors]}")
    if device.type != "cuda" and not INTERPRET:
        raise ValueError(f"Triton kernels need CUDA tensors (got {device}); set TRITON_INTERPRET=1 to run them on CPU for testing")
