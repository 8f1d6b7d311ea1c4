"""`TorchEngine`: the PyTorch reference model from a checkpoint, optionally with the Triton kernels."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import torch

from vitfast.errors import InputError
from vitfast.optimize import batch_buckets, graphed_forward, indexed_device, optimize
from vitfast.precision import from_dtype

from .engine import Engine


class TorchEngine(Engine):
    """The PyTorch model from a checkpoint, in `dtype` on `device` (default: the GPU if there is one).

    `optimized=True` swaps in the Triton kernels (`vitfast.optimize`); `cuda_graphs` (with
    `optimized`) replays the forward from CUDA graphs: True for one graph per batch size met, or the
    batch sizes to capture (see `optimize`; `warm_up(max_batch)` sets them and captures up front)."""

    kind = "pytorch"

    def __init__(self, model: torch.nn.Module, *, device: str | None = None, dtype: torch.dtype = torch.float32,
                 optimized: bool = False, cuda_graphs: bool | Sequence[int] = False, path: Path | None = None):  # fmt: skip
        super().__init__(model.config, precision=from_dtype(dtype), path=path)
        if cuda_graphs and not optimized:
            raise InputError("cuda_graphs replays the optimized model's forward: add optimized=True (--optimize)")
        # fixed now: a bare "cuda" would mean each calling thread's own current GPU
        self.device = indexed_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        self.optimized = optimized
        self.model = model.to(self.device, dtype).eval()
        if optimized:
            optimize(self.model, cuda_graphs=cuda_graphs)

    def __repr__(self) -> str:
        extra = ", optimized" + (", cuda_graphs" if self.graphed is not None else "") if self.optimized else ""
        return f"{type(self).__name__}({self.path or self.config.name}, precision={self.precision}{extra})"

    @property
    def graphed(self):
        """The model's `CudaGraphForward`, or None without CUDA graphs."""
        return graphed_forward(self.model)

    @torch.inference_mode()  # as _run: graphs are captured as the requests will replay them
    def warm_up(self, max_batch: int) -> tuple[int, ...]:
        """Get the optimized model ready for every batch of 1..max_batch before the first request: with CUDA graphs,
        capture those of `vitfast.batch_buckets(max_batch)` (largest first; a dynamic-size model's other image sizes
        then run without graphs); without, run each of those sizes once, so that Triton compiles and tunes the
        kernels for every size bucket now (a batch size met later may still compile one specialisation, ~1 s).
        Returns the sizes. For a server: `vitfast serve` calls it."""
        if not self.optimized:
            raise InputError("warm_up readies vitfast's kernels: make the engine with optimized=True (--optimize)")
        sizes = batch_buckets(max_batch)
        shape = (self.config.in_chans, *self.config.img_hw)
        with self._on_device():
            if self.graphed is not None:
                optimize(self.model, cuda_graphs=sizes)
                self.graphed.capture(shape, self.dtype, self.device)
                return sizes
            for size in reversed(sizes):
                self.model(torch.zeros((size, *shape), dtype=self.dtype, device=self.device))
        return sizes

    @torch.inference_mode()
    def _run(self, x: torch.Tensor) -> torch.Tensor:
        with self._on_device():
            return self.model(x.to(self.device, self.dtype)).float()

    def _on_device(self):
        """The engine's GPU as the current device: Triton launches its kernels there, whatever the tensors' device
        (a server's worker threads start on GPU 0)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
