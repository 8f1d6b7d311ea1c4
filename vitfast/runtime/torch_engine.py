"""`TorchEngine`: the PyTorch reference model from a checkpoint, optionally with the Triton kernels."""

from __future__ import annotations

from pathlib import Path

import torch

from vitfast.optimize import optimize
from vitfast.precision import from_dtype

from .engine import Engine


class TorchEngine(Engine):
    """The PyTorch model from a checkpoint; `optimized=True` swaps in the Triton kernels."""

    kind = "pytorch"

    def __init__(self, model: torch.nn.Module, *, device: str | None = None, dtype: torch.dtype = torch.float32,
                 optimized: bool = False, path: Path | None = None):  # fmt: skip
        super().__init__(model.config, precision=from_dtype(dtype), path=path)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        self.model = model.to(self.device, dtype).eval()
        if optimized:
            optimize(self.model)

    @torch.inference_mode()
    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.to(self.device, self.dtype)).float()
