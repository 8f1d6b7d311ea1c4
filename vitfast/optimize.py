"""`optimize(model)` swaps the reference blocks for Triton-kernel blocks; `restore(model)` undoes it."""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from vitfast.kernels import _common  # triton-free: precompile's recording flag

from .errors import VitfastError, VitfastWarning
from .fused import ATTENTION_PATHS, MLP_PATHS, FusedBlock, GemmPatchEmbed, can_fuse, can_gemm_embed, foreign_layers
from .model import HEAD_ROWS, VisionTransformer

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
        raise VitfastError("cuda_graphs needs the model on a CUDA GPU")


def optimize(model: nn.Module, *, cuda_graphs: bool | Sequence[int] = False, mlp: str = "auto", approximate_gelu: bool = False,
             attention: str = "auto", head_only: bool = True) -> nn.Module:  # fmt: skip
    """Replace every reference `Block` of a vitfast model with a `FusedBlock` sharing its parameters,
    and the patch embedding's convolution with one GEMM over the unfolded patches (`GemmPatchEmbed`).

    `state_dict()` keeps the same keys and tensors. Blocks built from injected custom layers are
    left as they are (with a warning naming them). Another library's model (timm's) is refused:
    `load_checkpoint` converts its weights. Attention maps (`forward_features(x, return_attention=True)`) and training
    mode fall back to the reference math on the same parameters. `cuda_graphs=True` captures the
    whole forward once per input shape/dtype and replays it (the batch-1 latency path); inputs are
    copied into the captured buffer and outputs are returned as fresh tensors. For a server's
    dynamic batches, give the batch sizes to capture instead (`cuda_graphs=vitfast.batch_buckets(64)`):
    a batch runs zero-padded in the smallest of them that holds it, batches above the largest run
    without a graph, and `model.forward.capture((C, H, W), dtype, device)` captures them all up front.
    All the graphs share one memory pool. With several GPUs, call the model with its GPU current
    (`with torch.cuda.device(...)`, as `load_engine` does): Triton launches on the current device.

    `mlp` picks the MLP path: "cublas" (cuBLAS GEMMs with their bias, then PyTorch's GELU or the QuickGELU kernel),
    "epilogue" (Triton GEMMs with bias+GELU and bias+LayerScale+residual as epilogues) or "auto"
    (per shape, whichever `benchmarks/gpu_kernels.py` measured faster on this kind of GPU, fc1 also
    "bias_gelu": cuBLAS without the bias, then vitfast's bias+GELU kernel; "cublas" where nothing was
    measured; on sm_90, mostly an H100's 2026-11-27 run: fc1's epilogue at most fp16 shapes from batch 64 up,
    cuBLAS for fc2 and proj).

    `attention` picks the attention: "vitfast" (the Triton kernel on the packed qkv), "sdpa" (PyTorch's
    scaled_dot_product_attention, cuDNN's on an H100) or "auto" (per shape, whichever the GPU proof
    measured faster on this kind of GPU: kernels/attention_dispatch.json; "vitfast" where nothing was).

    `approximate_gelu=True` runs an erf-GELU model's GELU in its tanh form, which cuBLASLt applies in
    fc1's epilogue: one launch less per block and the 4x-wide activation written once, for at most
    4.7e-4 absolute difference per activation (at x = +-2.70, where fp16's rounding step is 2e-3).
    Off by default: it changes the model's function, so measure its effect on your data before
    serving (the GPU tests hold ViT-B/L fp16/bf16 logits to the 2x rule against the fp32 erf model).
    Models trained with the tanh form (SigLIP) take that epilogue anyway.

    `head_only=True`: where the head reads only the leading tokens (class-token pooling: the class token;
    DeiT distilled: class and distillation tokens), `model(x)` has the last block compute those rows alone,
    their queries over every key, and the final norm only them (`VisionTransformer._head_rows_features`): the
    same function for less work (not bitwise: that attention runs on SDPA and those GEMMs at fewer rows; the last
    block's projection and MLP shrink from B x T rows to B x 1, about 6% of a ViT-B/16 forward).
    `forward_features` and `forward_intermediates` still return every token, and so does `model(x)` while a
    forward hook sits on the last block or the final norm. False computes every token in `model(x)` too.

    Calling optimize again on an optimized model changes `mlp`, `attention`, `approximate_gelu` and
    `head_only` (and can add CUDA graphs or change their batch sizes).
    """
    if not isinstance(model, VisionTransformer):  # another ViT's blocks (timm's) are not vitfast's, and would not be fused
        raise VitfastError(f"optimize takes a vitfast VisionTransformer, got {type(model).__name__}: load timm or Hugging Face "
                           "weights with vitfast.load_checkpoint (it converts them), or build one with vitfast.create_model")  # fmt: skip
    blocks = model.blocks
    if mlp not in MLP_PATHS:
        raise VitfastError(f"mlp must be one of {', '.join(MLP_PATHS)}, got {mlp!r}")
    if attention not in ATTENTION_PATHS:
        raise VitfastError(f"attention must be one of {', '.join(ATTENTION_PATHS)}, got {attention!r}")
    graph_sizes = _graph_sizes(cuda_graphs)
    _check_backend(model, bool(cuda_graphs))
    graphed = graphed_forward(model)
    if can_gemm_embed(getattr(model, "patch_embed", None)):
        model.patch_embed = GemmPatchEmbed(model.patch_embed)
    for i, block in enumerate(blocks):
        if can_fuse(block):
            blocks[i] = FusedBlock(block, mlp=mlp, approximate_gelu=approximate_gelu, attention=attention)
        elif isinstance(block, FusedBlock) and (block.mlp_path, block.approximate_gelu, block.attention_path) != (mlp, approximate_gelu, attention):
            block.mlp_path, block.approximate_gelu, block.attention_path = mlp, approximate_gelu, attention
            if graphed is not None:
                graphed.reset()  # captured with the old path: capture again
    unfused = [i for i, block in enumerate(blocks) if not isinstance(block, FusedBlock)]
    if unfused:
        layers = ", ".join(sorted({name for i in unfused for name in foreign_layers(blocks[i])})) or "a form of a layer the kernels do not take"
        warnings.warn(f"optimize fused {len(blocks) - len(unfused)} of {len(blocks)} blocks: block(s) {', '.join(map(str, unfused))} "
                      f"hold layers the kernels do not compute ({layers}) and run their own forward, unoptimized",
                      VitfastWarning, stacklevel=2)  # fmt: skip
    for block, following in zip(blocks, list(blocks)[1:] + [None]):
        if isinstance(block, FusedBlock):  # hand the next fused block its norm1 output too
            object.__setattr__(block, "next_block", following if isinstance(following, FusedBlock) else None)
    _set_head_only(model, head_only, graphed)
    if cuda_graphs and graphed is None:
        graphed = CudaGraphForward(model.forward, graph_sizes)
        model.forward = graphed  # instance attribute shadows the class method; restore() deletes it
        setattr(model, _GRAPHED, graphed)
    elif cuda_graphs and graphed.batch_sizes != graph_sizes:
        graphed.batch_sizes = graph_sizes
        graphed.reset()
    return model


def restore(model: nn.Module) -> nn.Module:
    """Put the reference blocks and patch embedding (same parameters) back and drop any captured CUDA graphs."""
    blocks = getattr(model, "blocks", None)
    if isinstance(getattr(model, "patch_embed", None), GemmPatchEmbed):
        model.patch_embed = _with_children_of(model.patch_embed)
    if isinstance(blocks, nn.Sequential):
        for i, block in enumerate(blocks):
            if isinstance(block, FusedBlock):
                blocks[i] = _with_children_of(block)
    if hasattr(model, _GRAPHED):
        del model.forward
        delattr(model, _GRAPHED)
    vars(model).pop(HEAD_ROWS, None)
    return model


def _with_children_of(wrapper: nn.Module) -> nn.Module:
    """The reference module a FusedBlock / GemmPatchEmbed wraps, holding the wrapper's layers (one replaced since stays)."""
    for name, child in wrapper.named_children():
        setattr(wrapper.reference, name, child)
    return wrapper.reference


def head_rows(model: nn.Module) -> int | None:
    """The leading tokens a vitfast VisionTransformer's head reads, when that is all it reads: 1 with class-token
    pooling, 2 for DeiT distilled with two heads (class and distillation tokens); None otherwise (mean or attention pooling, no
    pooling, features_only, a last block left unfused, or a subclass or instance with its own forward path)."""
    config = getattr(model, "config", None)
    path = ("forward", "forward_features", "forward_head", "pool", "_embed", "_head_rows_features")
    if not isinstance(model, VisionTransformer) or config is None or config.features_only:
        return None
    if any(getattr(type(model), name) is not getattr(VisionTransformer, name) for name in path):
        return None
    if any(name in vars(model) for name in path[1:]) or not isinstance(model.blocks[-1], FusedBlock):
        return None
    rows = 2 if config.distilled and config.dist_head else 1 if config.global_pool == "token" else None
    return rows if rows is not None and model.num_prefix_tokens >= rows else None


def _set_head_only(model: nn.Module, head_only: bool, graphed: CudaGraphForward | None) -> None:
    """Set or clear the model's HEAD_ROWS, which its forward reads (see `optimize`'s head_only); graphs captured
    with the other forward are dropped, to be captured again."""
    rows = head_rows(model) if head_only else None
    if vars(model).get(HEAD_ROWS) == rows:
        return
    if rows is None:
        delattr(model, HEAD_ROWS)
    else:
        setattr(model, HEAD_ROWS, rows)
    if graphed is not None:
        graphed.reset()


def graphed_forward(model: nn.Module) -> CudaGraphForward | None:
    """The model's `CudaGraphForward` (from `optimize(model, cuda_graphs=...)`), or None."""
    return getattr(model, _GRAPHED, None)


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """CUDA-graph batch sizes for batches of 1..max_batch: the powers of two and the sizes halfway
    between them (1, 2, 3, 4, 6, 8, 12, 16, 24, ...), capped by max_batch itself. A batch runs in the
    smallest size that holds it, so padding costs at most a third of a batch from 4 on; the count
    grows as 2 log2(max_batch) (16 graphs for 256)."""
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise VitfastError(f"max_batch must be a positive int, got {max_batch!r}")
    sizes, p = [], 1
    while p < max_batch:
        sizes += [p, p + p // 2] if p >= 2 else [p]
        p *= 2
    return tuple(sorted({s for s in sizes if s < max_batch} | {max_batch}))


def _graph_sizes(cuda_graphs) -> tuple[int, ...] | None:
    """optimize's `cuda_graphs` as capture sizes: None for True/False (one graph per batch size met), else the sorted sizes."""
    if isinstance(cuda_graphs, bool):
        return None
    sizes = tuple(cuda_graphs) if isinstance(cuda_graphs, (list, tuple, range)) else ()
    if not sizes or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise VitfastError(f"cuda_graphs takes True, False or the batch sizes to capture (positive ints, e.g. "
                           f"vitfast.batch_buckets(64)), got {cuda_graphs!r}")  # fmt: skip
    return tuple(sorted(set(sizes)))


class CudaGraphForward:
    """Replay `forward` from CUDA graphs: one per input shape/dtype/device, or with `batch_sizes`,
    one per size there, a batch running zero-padded in the smallest size that holds it (above the
    largest, the plain forward runs). Every graph allocates from one shared memory pool: replays run
    one after another on the caller's stream and each output is copied out before the next replay,
    so a graph may reuse the memory another one used (as vLLM shares one pool across its batch sizes)."""

    def __init__(self, forward, batch_sizes: tuple[int, ...] | None = None):
        self.forward = forward
        self.batch_sizes = batch_sizes
        self.reset()

    def reset(self) -> None:
        """Drop every graph, with their pool: a pool whose graphs are all gone may still hold cached blocks,
        and torch refuses to capture into it again."""
        self.graphs: dict[tuple, tuple] = {}  # (shape, dtype, device) -> (replay, static_in, static_out)
        self.pool = None
        self.stream = None  # this forward's own capture stream (see _capture)
        self.sample_shapes: set[tuple[int, ...]] | None = None  # after capture(): the image shapes graphed

    def size_for(self, n: int) -> int | None:
        """The captured batch size a batch of n runs in (None: above the largest, no graph)."""
        if self.batch_sizes is None:
            return n
        return next((s for s in self.batch_sizes if s >= n), None)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _common.RECORDING:  # precompile's recording: no kernel runs, so a graph captured now would replay garbage
            return self.forward(x)
        n = x.shape[0]
        size = self.size_for(n)
        if size is None or (self.sample_shapes is not None and tuple(x.shape[1:]) not in self.sample_shapes):
            return self.forward(x)  # no graph: too large, or an image size capture() was not given (each would cost memory)
        replay, static_in, static_out = self._graph((size, *x.shape[1:]), x.dtype, x.device)
        static_in[:n].copy_(x)
        if n < size:
            static_in[n:].zero_()  # padding rows: each image runs alone through a ViT, zeros only keep them finite
        replay()
        return static_out[:n].clone()

    def capture(self, sample_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> None:
        """Capture every batch size now (largest first, so the smaller ones fit in the pool it leaves),
        for images of `sample_shape` [C, H, W]: a server's start-up, so no request pays for a capture.
        From then on, only the image shapes given to capture() run from graphs: a dynamic-size model's
        other sizes run without, so that a client's stream of new sizes cannot grow the GPU memory."""
        if self.batch_sizes is None:
            raise VitfastError("capture() needs the batch sizes: optimize(model, cuda_graphs=vitfast.batch_buckets(MAX_BATCH))")
        device = indexed_device(device)  # tensors on "cuda" say cuda:N: the keys must match theirs
        self.sample_shapes = (self.sample_shapes or set()) | {tuple(sample_shape)}
        for size in reversed(self.batch_sizes):
            self._graph((size, *sample_shape), dtype, device)

    def _graph(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple:
        """(replay, static_in, static_out) for inputs of `shape`, captured on first use."""
        key = (shape, dtype, device)
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        return self.graphs[key]

    @torch.no_grad()
    def _capture(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        static_in = static_input(shape, dtype, device)
        with torch.cuda.device(device):  # Triton launches on the current device, whatever the tensors' device
            if self.stream is None:  # torch.cuda.graph's default stream is shared by every graph in the process, and
                self.stream = torch.cuda.Stream(device)  # with it cuBLAS's workspace: another model's reset would free it
            self.stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(self.stream):
                for _ in range(3):  # warm-up outside capture: Triton autotuning, and cuBLAS's workspace for this stream
                    self.forward(static_in)
            torch.cuda.current_stream(device).wait_stream(self.stream)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                static_out = self.forward(static_in)
        return graph.replay, static_in, static_out


def indexed_device(device: torch.device | str) -> torch.device:
    """`device` with its GPU index: a bare "cuda" means whichever GPU is current, while tensors always name theirs."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def static_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A graph's input buffer. Made outside inference mode even when captured inside it (TorchEngine runs
    there), so that the model can still be called under plain no_grad: the copy into it would fail on an
    inference tensor."""
    with torch.inference_mode(False):
        return torch.zeros(shape, dtype=dtype, device=device)
