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


def runs_reference(t: torch.Tensor) -> bool:
    """Whether an op takes its plain-PyTorch reference instead of its Triton kernel.

    CUDA tensors always run the kernel. CPU tensors run it through the interpreter only when they
    are real and TRITON_INTERPRET=1; traced ones (fake tensors under torch.compile / torch.export,
    which the interpreter cannot read) and any CPU tensor without the interpreter take the
    reference math, so an optimized model traces and runs on CPU as well.
    """
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "cpu" and (not INTERPRET or is_fake(t))
