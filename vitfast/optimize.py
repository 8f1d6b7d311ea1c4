"""`optimize(model)` swaps the reference blocks for Triton-kernel blocks; `restore(model)` undoes it."""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import nn

from .errors import VitfastError
from .fused import ATTENTION_PATHS, MLP_PATHS, FusedBlock, GemmPatchEmbed, can_fuse, can_gemm_embed

_GRAPHED = "_vitfast_cuda_graphs"


def _check_backend(model: nn.Module, cuda_graphs: bool) -> None:
    if importlib.util.find_spec("triton") is None:
        raise VitfastError("optimize needs Triton: pip install 'vitfast[triton]' (it ships with CUDA builds of torch)")
    if not hasattr(torch.library, "triton_op"):  # the kernels register as torch.library.triton_op (torch 2.6+)
        raise VitfastError(f"optimize needs torch 2.6 or newer for its Triton kernels (torch.library.triton_op); this is torch "
                           f"{torch.__version__}: upgrade torch, or run the reference model as it is")  # fmt: skip
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    device = next(model.parameters()).device
    if device.type == "cuda":
        pass
    elif not torch.cuda.is_available() and not interpret:
        raise VitfastError(
            "optimize needs a CUDA GPU for its Triton kernels and none is visible; "
            "for testing on CPU set TRITON_INTERPRET=1 before importing triton (slow, for correctness only)"
        )
    elif not interpret:
        raise VitfastError(f"the model is on {device}; move it to the GPU first (model.cuda()), then optimize it")
    if cuda_graphs and device.type != "cuda":
        raise VitfastError("cuda_graphs=True needs the model on a CUDA GPU")


def optimize(model: nn.Module, *, cuda_graphs: bool = False, mlp: str = "auto", approximate_gelu: bool = False,
             attention: str = "auto") -> nn.Module:  # fmt: skip
    """Replace every reference `Block` of a vitfast model with a `FusedBlock` sharing its parameters,
    and the patch embedding's convolution with one GEMM over the unfolded patches (`GemmPatchEmbed`).

    `state_dict()` keeps the same keys and tensors. Blocks built from injected custom layers are
    left as they are. Attention maps (`forward_features(x, return_attention=True)`) and training
    mode fall back to the reference math on the same parameters. `cuda_graphs=True` captures the
    whole forward once per input shape/dtype and replays it (the batch-1 latency path); inputs are
    copied into the captured buffer and outputs are returned as fresh tensors.

    `mlp` picks the MLP path: "cublas" (cuBLAS GEMMs with their bias, then PyTorch's GELU or the QuickGELU kernel),
    "epilogue" (Triton GEMMs with bias+GELU and bias+LayerScale+residual as epilogues) or "auto"
    (per shape, whichever `benchmarks/gpu_kernels.py` measured faster on this kind of GPU;
    "cublas" where nothing was measured; on the H100 measured so far, cuBLAS on 46 of 48 shapes).

    `attention` picks the attention: "vitfast" (the Triton kernel on the packed qkv), "sdpa" (PyTorch's
    scaled_dot_product_attention, cuDNN's on an H100) or "auto" (per shape, whichever the GPU proof
    measured faster on this kind of GPU: kernels/attention_dispatch.json; "vitfast" where nothing was).

    `approximate_gelu=True` runs an erf-GELU model's GELU in its tanh form, which cuBLASLt applies in
    fc1's epilogue: one launch less per block and the 4x-wide activation written once, for at most
    4.7e-4 absolute difference per activation (at x = +-2.70, where fp16's rounding step is 2e-3).
    Off by default: it changes the model's function, so measure its effect on your data before
    serving (the GPU tests hold ViT-B/L fp16/bf16 logits to the 2x rule against the fp32 erf model).
    Models trained with the tanh form (SigLIP) take that epilogue anyway.

    Calling optimize again on an optimized model changes `mlp`, `attention` and `approximate_gelu`
    (and can add CUDA graphs).
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Sequential):
        raise VitfastError("optimize takes a vitfast VisionTransformer (create_model / load_checkpoint)")
    if mlp not in MLP_PATHS:
        raise VitfastError(f"mlp must be one of {', '.join(MLP_PATHS)}, got {mlp!r}")
    if attention not in ATTENTION_PATHS:
        raise VitfastError(f"attention must be one of {', '.join(ATTENTION_PATHS)}, got {attention!r}")
    _check_backend(model, cuda_graphs)
    if can_gemm_embed(getattr(model, "patch_embed", None)):
        model.patch_embed = GemmPatchEmbed(model.patch_embed)
    for i, block in enumerate(blocks):
        if can_fuse(block):
            blocks[i] = FusedBlock(block, mlp=mlp, approximate_gelu=approximate_gelu, attention=attention)
        elif isinstance(block, FusedBlock) and (block.mlp_path, block.approximate_gelu, block.attention_path) != (mlp, approximate_gelu, attention):
            block.mlp_path, block.approximate_gelu, block.attention_path = mlp, approximate_gelu, attention
            if hasattr(model, _GRAPHED):
                getattr(model, _GRAPHED).graphs.clear()  # captured with the old path: capture again
    for block, following in zip(blocks, list(blocks)[1:] + [None]):
        if isinstance(block, FusedBlock):  # hand the next fused block its norm1 output too
            object.__setattr__(block, "next_norm", following.norm1 if isinstance(following, FusedBlock) else None)
    if cuda_graphs and not hasattr(model, _GRAPHED):
        graphed = CudaGraphForward(model.forward)
        model.forward = graphed  # instance attribute shadows the class method; restore() deletes it
        setattr(model, _GRAPHED, graphed)
    return model


def restore(model: nn.Module) -> nn.Module:
    """Put the reference blocks and patch embedding (same parameters) back and drop any captured CUDA graphs."""
    blocks = getattr(model, "blocks", None)
    if isinstance(getattr(model, "patch_embed", None), GemmPatchEmbed):
        model.patch_embed = model.patch_embed.reference
    if isinstance(blocks, nn.Sequential):
        for i, block in enumerate(blocks):
            if isinstance(block, FusedBlock):
                blocks[i] = block.reference
    if hasattr(model, _GRAPHED):
        del model.forward
        delattr(model, _GRAPHED)
    return model


class CudaGraphForward:
    """Capture `forward` in a CUDA graph per (shape, dtype, device) and replay it."""

    def __init__(self, forward):
        self.forward = forward
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self.graphs:
            static_in = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # warm-up outside capture: Triton autotuning and cuBLAS workspaces
                    self.forward(static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self.forward(static_in)
            self.graphs[key] = (graph, static_in, static_out)
        graph, static_in, static_out = self.graphs[key]
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()
