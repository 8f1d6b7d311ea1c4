"""`FusedBlock`: a reference `Block`'s own parameters run through the Triton kernels.

Per block: fused attention read straight from the packed qkv (qkv GEMM on cuBLAS), then the two
residual branches. Each branch ends in "residual add (LayerScale folded in) + the next
LayerNorm", so a block hands the next one the residual stream *and* that block's normalised input
(`(x, norm1(x))`); only the first block runs a LayerNorm of its own, and the last block (or one
followed by a non-fused block) ends with the plain residual add. The GEMMs that end a branch
(attention projection, fc2) and fc1 take one of two paths, per shape:

- "cublas": cuBLAS GEMM (bias included) -> add + LayerNorm kernel (x + gamma * y); fc1: GEMM
  with its bias -> PyTorch's GELU (QuickGELU: GEMM without bias -> the bias + GELU kernel, one
  kernel for PyTorch's three). 8 launches per block. GELU's tanh form (SigLIP, or any model
  under `optimize(model, approximate_gelu=True)`) is applied by cuBLASLt in fc1's epilogue
  (`linear_gelu_tanh`): 7 launches, and the 4x-wide activation is written once; under "auto" that
  replaces the table's fc1 choice, which timed the erf form.
- "bias_gelu" (fc1 only, from the measured table): cuBLAS GEMM without its bias -> the bias + GELU
  kernel, which for fp16/bf16 computes erf's GELU through a cheaper erfc (kernels/bias_gelu.py: 20
  instead of 35 instructions per element; 95% of copy bandwidth on an H100, but 1.00-1.06x
  cuBLAS's bias epilogue + PyTorch's GELU there: the table picks it at a few shapes only).
- "epilogue": Triton GEMMs with the elementwise work as their epilogue: proj and fc2 + bias +
  LayerScale + residual + LayerNorm (kernels/linear_layernorm.py), fc1 + bias + GELU
  (kernels/linear_epilogue.py); on Hopper, in eager calls, their TMA forms. 5 launches per block
  (qkv, attention, proj, fc1, fc2). A torch.compile / torch.export trace launches the pointer forms,
  so inside a trace the table's `fc1_traced` / `fc2_traced` choices apply (`nearest_paths`).

`optimize(model, mlp="auto")` takes, for each shape, the path that `benchmarks/gpu_proof.py`
measured faster on a GPU of the same compute capability (kernels/mlp_dispatch.json, see
`choose_mlp_paths`; proj follows fc2's choice, having the same epilogue). Where nothing was
measured it takes "cublas". Measured on sm_90 (H100 and H200; the table holds each shape's last run, mostly an
H100's on 2026-11-27): fc1's Triton epilogue wins at most fp16 shapes from batch 64 up (1.03-1.17x), "bias_gelu" at a
few (1.03-1.06x), cuBLAS below batch 64 and for ViT-L bf16; fc2, and proj with it, stay on cuBLAS +
add+LayerNorm (the fc2 epilogue GEMM: 0.15-0.64x); "epilogue" can be forced with `mlp="epilogue"`.

The attention takes the same kind of choice (`optimize(model, attention="auto")`): the Triton
kernel reading the packed qkv, or PyTorch's scaled_dot_product_attention on its [B, H, N, D] views
(cuDNN's on an H100), per (compute capability, dtype, N, head_dim, batch x heads bucket), from
kernels/attention_dispatch.json, which the GPU proof's attention rows write (`write_attention_dispatch`);
"vitfast" where nothing was measured.

DINOv2 giant's SwiGLU MLP (`SwiGLUPacked`) runs fc1 on cuBLAS without its bias, then the
bias + silu(gate) * value kernel (kernels/bias_swiglu.py) whatever the path; AIMv2's (`SwiGLU`, gate
and value Linears apart) runs both on cuBLAS, then silu(gate) * value in the same kernel. Their fc2
and the attention half take the paths above. RMSNorm blocks (AIMv2) take the same kernels in their
RMS form, and Linears without a bias the same kernels without one. Rotary positions (DINOv3, EVA-02) take
one more kernel between the qkv GEMM and the attention (kernels/rope.py: q and k of the patch tokens rotated
into a new packed qkv), so 9 launches per block on the cuBLAS path, 6 on the epilogue path. A norm inside a
branch (EVA-02, BEiT-3: before the attention's output projection, before fc2) is one LayerNorm kernel more each.

The forward has no Python-side state or caches to trace through: `torch.compile(fullgraph=True)`
and `torch.export` see one graph of `torch.ops.vitfast.*` calls (see kernels/_common.py,
`runs_reference`, for what those ops run on CPU). In plain eager mode the same launchers are called
straight, not through the op dispatcher (`kernel_ops`), whose host time per call set the batch-1
latency on an H100.
"""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import json
import math
import types
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from vitfast.kernels._common import EAGER_OPS, next_pow2, seen_by_torch  # triton-free: the launchers' bucketing, the ops' eager entries

from .errors import VitfastWarning
from .layers import Attention, Block, DropPath, LayerScale, Mlp, PatchEmbed, QuickGELU, Rope, SwiGLU, SwiGLUPacked, check_image_shape

MLP_PATHS = ("auto", "cublas", "epilogue")
ATTENTION_PATHS = ("auto", "vitfast", "sdpa")
DEFAULT_MLP_PATHS = ("cublas", "cublas")  # (fc1, fc2) where no measurement exists
KERNEL_MODULES = ("add_layernorm", "attention", "bias_gelu", "bias_swiglu", "linear_epilogue", "linear_layernorm", "rope")


@functools.cache
def load_kernels() -> None:
    """Import the kernel modules, which registers their `torch.ops.vitfast.*` ops (triton is an
    optional dependency, so not at vitfast's import)."""
    for name in KERNEL_MODULES:
        importlib.import_module(f"vitfast.kernels.{name}")  # lazy: each kernel module imports triton (optional)


def kernel_ops(x: torch.Tensor):
    """The vitfast ops for a forward on x: `torch.ops.vitfast` where a trace or a dispatch mode must
    see them (torch.compile, torch.export, FakeTensor, FlopCounterMode, torch.func, a subclass tensor), else
    the same launchers called straight (kernels/_common.py `vitfast_op`). Same names, same results."""
    if torch.compiler.is_compiling() or seen_by_torch(x):
        return torch.ops.vitfast
    return _eager_ops()


@functools.cache
def _eager_ops():
    load_kernels()  # fills EAGER_OPS
    return types.SimpleNamespace(**EAGER_OPS) if EAGER_OPS else torch.ops.vitfast


# ---------------------------------------------------------------------------- MLP dispatch
def m_bucket(rows: int) -> int:
    """The dispatch table's M bucket: GEMM rows (batch x tokens) rounded up to a power of two,
    the same bucket the epilogue GEMM's autotuner keys on."""
    return next_pow2(rows)


def _read_table(name: str) -> tuple[dict, ...]:
    """The measured entries of the dispatch table kernels/`name` (package data)."""
    return tuple(json.loads(importlib.resources.files("vitfast.kernels").joinpath(name).read_text())["entries"])


@functools.cache
def mlp_dispatch_table() -> tuple[dict, ...]:
    """The measured entries of kernels/mlp_dispatch.json (read once; `cache_clear()` after rewriting it)."""
    return _read_table("mlp_dispatch.json")


@functools.cache
def _capability(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def _measured(table: tuple[dict, ...], device: torch.device, match: dict, fields: tuple[str, ...]) -> dict[torch.dtype, tuple[tuple, ...]]:
    """This GPU's entries of a dispatch table whose `match` fields agree, as dtype -> (their `fields`, ...);
    empty off CUDA or where nothing was measured. Read once per block, so the forward only does a lookup."""
    if device.type != "cuda" or not table:
        return {}
    match = {"compute_capability": _capability(device)} | match
    choices: dict[torch.dtype, list] = {}
    for e in table:
        if all(e[k] == v for k, v in match.items()):
            choices.setdefault(getattr(torch, e["dtype"]), []).append(tuple(e.get(f) for f in fields))
    return {dtype: tuple(entries) for dtype, entries in choices.items()}


def _nearest_bucket(entries: list | tuple, index: int, n: int) -> tuple:
    """The entry whose power-of-two bucket (its element `index`) is nearest, on a log scale, to `next_pow2(n)`."""
    bucket = math.log2(next_pow2(n))
    return min(entries, key=lambda e: abs(math.log2(e[index]) - bucket))


MlpChoice = tuple[int, str, str, "str | None", "str | None"]  # (m_bucket, fc1, fc2, fc1_traced, fc2_traced)


def measured_choices(device: torch.device, C: int, hidden: int) -> dict[torch.dtype, tuple[MlpChoice, ...]]:
    """This GPU's measured entries for one MLP shape: dtype -> ((m_bucket, fc1, fc2, fc1_traced, fc2_traced), ...)."""
    return _measured(mlp_dispatch_table(), device, {"C": C, "hidden": hidden}, ("m_bucket", "fc1", "fc2", "fc1_traced", "fc2_traced"))


def nearest_paths(choices: tuple[MlpChoice, ...], rows: int, traced: bool = False) -> tuple[str, str]:
    """(fc1, fc2) of the entry whose M bucket is nearest (log scale) to `m_bucket(rows)`; "cublas"
    for both when there is none. `traced` (torch.compile, torch.export): the paths as measured for the
    kernels a trace launches (`fc1_traced`, `fc2_traced`: on Hopper eager calls take the TMA GEMMs,
    traces the pointer ones), where the entry has them."""
    if not choices:
        return DEFAULT_MLP_PATHS
    _, fc1, fc2, fc1_traced, fc2_traced = _nearest_bucket(choices, 0, rows)
    return ((fc1_traced or fc1), (fc2_traced or fc2)) if traced else (fc1, fc2)


def choose_mlp_paths(mode: str, device: torch.device, dtype: torch.dtype, C: int, hidden: int, rows: int, traced: bool = False) -> tuple[str, str]:
    """(fc1 path, fc2 path), each "cublas" or "epilogue", fc1 also "bias_gelu" from the table (proj follows fc2).

    mode "cublas" / "epilogue" forces both. "auto" looks up the measured table: the entry for this
    GPU's compute capability, dtype, C and hidden whose M bucket is nearest (log scale) to
    `m_bucket(rows)`; with no such entry (CPU, an unmeasured GPU or shape) both are "cublas".
    `traced`: the choice for a torch.compile / torch.export trace (see `nearest_paths`).
    """
    if mode != "auto":
        return mode, mode
    return nearest_paths(measured_choices(device, C, hidden).get(dtype, ()), rows, traced)


# ---------------------------------------------------------------------------- attention dispatch
@functools.cache
def attention_dispatch_table() -> tuple[dict, ...]:
    """The measured entries of kernels/attention_dispatch.json (read once; `cache_clear()` after rewriting it)."""
    return _read_table("attention_dispatch.json")


def measured_attention(device: torch.device, head_dim: int) -> dict[torch.dtype, tuple[tuple[int, int, str], ...]]:
    """This GPU's measured attention entries for one head_dim: dtype -> ((N, bh_bucket, path), ...)."""
    return _measured(attention_dispatch_table(), device, {"head_dim": head_dim}, ("N", "bh_bucket", "path"))


def nearest_attention_path(choices: tuple[tuple[int, int, str], ...], N: int, bh: int) -> str:
    """The path of the entry for this sequence length whose batch x heads bucket is nearest (log
    scale) to `next_pow2(bh)`; "vitfast" where that N was not measured."""
    same_n = [c for c in choices if c[0] == N]
    return _nearest_bucket(same_n, 1, bh)[2] if same_n else "vitfast"


# ---------------------------------------------------------------------------- the block
def can_fuse(block: nn.Module) -> bool:
    """Only the reference classes are fused; injected custom layers keep their own forward."""
    return type(block) is Block and _fusable_layers(block)


# what a block of vitfast's own holds: the classes the fused forward computes, and the dropouts it skips in eval mode
REFERENCE_LAYERS = (Block, Attention, Mlp, SwiGLUPacked, SwiGLU, LayerScale, QuickGELU, DropPath, nn.Linear, nn.GELU, nn.SiLU,
                    nn.LayerNorm, nn.RMSNorm, nn.Identity, nn.Dropout)  # fmt: skip


def foreign_layers(block: nn.Module) -> list[str]:
    """The class names of `block` and its layers that are none of `REFERENCE_LAYERS` (why `can_fuse` refuses a block,
    unless a reference class is used in a form the kernels do not take, such as SwiGLU with GELU)."""
    return sorted({type(m).__name__ for m in block.modules() if type(m) not in REFERENCE_LAYERS})


def _fusable_layers(block: nn.Module) -> bool:
    """Whether every layer the fused forward reads past (it takes their weights, not their forward) is the reference
    class it computes: an nn.Linear subclass (a LoRA adapter) or another activation would be dropped silently."""
    attn, mlp = block.attn, block.mlp
    if type(attn) is not Attention or type(mlp) not in (Mlp, SwiGLUPacked, SwiGLU):
        return False
    linears = (attn.qkv, attn.proj, mlp.fc2, *((mlp.fc1_g, mlp.fc1_x) if type(mlp) is SwiGLU else (mlp.fc1,)))
    return (
        all(type(linear) is nn.Linear for linear in linears)
        and type(mlp.act) in ((nn.GELU, QuickGELU) if type(mlp) is Mlp else (nn.SiLU,))  # the forms the kernels apply
        and all(_fusable_norm(norm) for norm in (block.norm1, block.norm2))
        and all(type(norm) is nn.Identity or _fusable_norm(norm) for norm in (attn.norm, mlp.norm))  # inside the branches
        and type(block.ls1) in (nn.Identity, LayerScale)  # what the branch-end epilogues compute
        and type(block.ls2) in (nn.Identity, LayerScale)
    )


KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _hooked(module: nn.Module) -> bool:
    """Whether `module` has forward hooks of its own. Global ones (`register_module_forward_hook`: FlopCounterMode's
    module tracker, for one) are left out: they see a fused block as one module call."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _fusable_norm(norm: nn.Module) -> bool:
    """An affine LayerNorm with its bias, or an affine RMSNorm with its eps stated (the kernels' two forms)."""
    if type(norm) is nn.LayerNorm:
        return norm.elementwise_affine and norm.bias is not None
    return type(norm) is nn.RMSNorm and norm.elementwise_affine and norm.eps is not None


def _norm(ops, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """norm(x) by the LayerNorm or RMSNorm kernel (`ops`: `kernel_ops(x)`)."""
    if isinstance(norm, nn.RMSNorm):
        return ops.rmsnorm(x, norm.weight, norm.eps)
    return ops.layernorm(x, norm.weight, norm.bias, norm.eps)


class FusedBlock(nn.Module):
    """Same submodules (same names, same Parameter objects) as the wrapped `Block`, so
    `state_dict()` is unchanged; only the forward differs.

    forward takes x [B, N, C] or the previous fused block's `(x, norm1(x))` and returns
    `(x, next_block.norm1(x))` when `next_block` (the next fused block, set by `optimize`) is given,
    else x. `mlp_path` is "auto", "cublas" or "epilogue" ("cublas" under torch.autocast) and `attention_path` "auto", "vitfast" or
    "sdpa" (see the module docstring);
    `approximate_gelu` runs an erf-GELU MLP in GELU's tanh form (`gelu_form`). The reference `Block`'s
    forward runs over the same submodules instead of the kernels for: attention maps (`return_attention=True`),
    training mode (dropout, drop-path), autograd (the kernels have no backward: a call with grad enabled and a
    parameter or the input requiring grad, which warns once), a dtype the kernels do not take (float64, which
    warns), forward hooks on the block's layers (so they fire), and a layer replaced since (`_fusable_layers`).
    A block with forward hooks of its own, or followed by one, hands on x alone, so hooks see tensors.
    """

    def __init__(self, block: Block, mlp: str = "auto", approximate_gelu: bool = False, attention: str = "auto"):
        super().__init__()
        if mlp not in MLP_PATHS:
            raise ValueError(f"mlp must be one of {MLP_PATHS}, got {mlp!r}")
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
        load_kernels()  # import (and register) the Triton ops now, not on the first forward
        for name, child in block.named_children():
            self.add_module(name, child)
        # kept for restore() / the next block's LayerNorm; not submodules (no duplicate state_dict keys)
        object.__setattr__(self, "reference", block)
        object.__setattr__(self, "next_block", None)
        self.mlp_path = mlp
        self.approximate_gelu = approximate_gelu
        self.attention_path = attention
        fc1 = block.mlp.fc1_g if isinstance(block.mlp, SwiGLU) else block.mlp.fc1
        self.measured = measured_choices(fc1.weight.device, fc1.in_features, fc1.out_features)
        self.measured_attention = measured_attention(fc1.weight.device, block.attn.head_dim)
        self._read_layers()
        self.train(block.training)

    def _takes_kernels(self, x: torch.Tensor) -> bool:
        """Whether this forward may run the kernels rather than the reference math (see the class docstring). The
        warnings are for eager calls: a torch.compile trace cannot hold one (it would break a fullgraph compile)."""
        eager = not torch.compiler.is_compiling()
        if x.dtype not in KERNEL_DTYPES:
            if eager:
                warnings.warn(f"an optimized block got {x.dtype} input, which the Triton kernels do not take: it runs the "
                              "reference math (fp16, bf16 or fp32 inputs take the kernels)", VitfastWarning, stacklevel=3)  # fmt: skip
            return False
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())):
            if eager:
                warnings.warn("an optimized model was called with autograd on: its Triton kernels have no backward, so it runs "
                              "the reference math to give correct gradients; for inference call it under torch.inference_mode() "
                              "(or torch.no_grad()), or model.requires_grad_(False)", VitfastWarning, stacklevel=3)  # fmt: skip
            return False
        if not eager:  # traced once per structure (Dynamo guards on the modules), so read it afresh
            layers = (*self.children(), *self.attn.children(), *self.mlp.children())
            return _fusable_layers(self) and not any(_hooked(m) for m in layers)
        if any(tuple(modules.values()) != layers for modules, layers in self._layers):  # a layer replaced since
            self._read_layers()
        return self._fusable and not any(self._hooks)

    def _read_layers(self) -> None:
        """Note the layers below the block and below its attention and MLP (each parent's `_modules` and what it held),
        their hook dicts, and whether the kernels compute them (`_fusable_layers`). Per eager call only these are
        compared, about a microsecond, where reading the layers through nn.Module's attribute lookup cost 30-70 us
        a block on CPU (and host time sets the batch-1 latency)."""
        parents = (self, self.attn, self.mlp)
        object.__setattr__(self, "_layers", tuple((p._modules, tuple(p._modules.values())) for p in parents))
        hooks = [(m._forward_hooks, m._forward_pre_hooks) for p in parents for m in p._modules.values()]
        object.__setattr__(self, "_hooks", tuple(d for pair in hooks for d in pair))  # registering a hook fills these in place
        object.__setattr__(self, "_fusable", _fusable_layers(self))

    def train(self, mode: bool = True) -> "FusedBlock":
        self.reference.training = mode  # restore() hands it back in the mode the model is in
        return super().train(mode)

    @property
    def gelu_form(self) -> str | None:
        """The GELU form fc1's path applies ('none' = erf, 'tanh', 'sigmoid'; None for the SwiGLU MLPs):
        the model's own, or 'tanh' for an erf model optimized with `approximate_gelu=True`."""
        form = getattr(self.mlp.act, "approximate", None) if type(self.mlp) is Mlp else None
        return "tanh" if self.approximate_gelu and form == "none" else form

    def attention_kernel(self, dtype: torch.dtype, B: int, N: int) -> str:
        """"vitfast" (kernels/attention.py) or "sdpa" (PyTorch's scaled_dot_product_attention) for this input."""
        if self.attention_path != "auto":
            return self.attention_path
        return nearest_attention_path(self.measured_attention.get(dtype, ()), N, B * self.attn.num_heads)

    def mlp_paths(self, dtype: torch.dtype, rows: int, form: str | None = None) -> tuple[str, str]:
        """(fc1, fc2): forced, or the table's for this shape (`nearest_paths`). The table timed fc1 with GELU's erf
        form; the tanh `form` has cuBLASLt's epilogue (`linear_gelu_tanh`), which beat the Triton GEMM at every
        ViT-S/B/L shape the H100 timed (1.25-1.6x cuBLAS + GELU against 0.68-1.17x), so "auto" gives it "cublas"."""
        if self.mlp_path != "auto":
            return self.mlp_path, self.mlp_path
        fc1, fc2 = nearest_paths(self.measured.get(dtype, ()), rows, torch.compiler.is_compiling())
        return ("cublas" if form == "tanh" else fc1), fc2

    def forward(self, x, return_attention: bool = False, rope: Rope | None = None, rows: int | None = None):
        """x [B, N, C] or (x, norm1(x)) -> x, or (x, next_norm(x)) when `next_norm` is set. `rope`: the rotary
        tables [Np, D] of the last Np tokens (DINOv3, EVA-02), as the reference block takes them. `rows`: only
        the first `rows` tokens' outputs [B, rows, C] (their queries over every key), for a last block whose
        model reads no other (`VisionTransformer._head_rows_features`)."""
        x, h = x if isinstance(x, tuple) else (x, None)
        if return_attention or self.training or not self._takes_kernels(x):
            return Block.forward(self, x, return_attention=return_attention, rope=rope)
        ops = kernel_ops(x)
        attn, mlp, nxt = self.attn, self.mlp, self.next_block
        # the next block's norm1 output comes along unless a hook must see tensors, or that norm is no longer one the
        # kernels compute (the next block then takes the reference math, which ignores it anyway)
        nxt = None if nxt is None or _hooked(self) or _hooked(nxt) or not _fusable_norm(nxt.norm1) else nxt.norm1
        B, N, C = x.shape
        if h is None:
            h = _norm(ops, x, self.norm1)
        qkv = F.linear(h, attn.qkv.weight, attn.qkv.bias).view(B, N, 3, attn.num_heads, attn.head_dim)
        if rope is not None:
            qkv = ops.rope_qkv(qkv, rope.cos, rope.sin, rope.interleaved)
        if rows is not None and rows < N:  # a few queries over every key: SDPA's, too small a job for a tiled kernel
            if nxt is not None:
                raise ValueError("rows= is for the last block: a next block would need every token")
            q, k, v = (t.transpose(1, 2) for t in (qkv[:, :rows, 0], qkv[:, :, 1], qkv[:, :, 2]))  # [B, H, rows or N, D]
            o = F.scaled_dot_product_attention(q, k, v, scale=attn.scale).transpose(1, 2).reshape(B, rows, -1)
            x, N = x[:, :rows], rows
        elif self.attention_kernel(x.dtype, B, N) == "sdpa":  # where SDPA measured faster on this GPU
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, N, D] views
            o = F.scaled_dot_product_attention(q, k, v, scale=attn.scale).transpose(1, 2).reshape(B, N, -1)
        else:
            o = ops.fused_attention(qkv, attn.scale)
        if type(attn.norm) is not nn.Identity:
            o = _norm(ops, o, attn.norm)
        form = self.gelu_form
        if torch.is_autocast_enabled(x.device.type):  # autocast casts F.linear's operands, not the Triton GEMMs' (one dtype
            fc1 = fc2 = "cublas"  # each); the elementwise kernels after cuBLAS read any float dtype
        else:
            fc1, fc2 = self.mlp_paths(x.dtype, B * N, form)
        x, h = self._branch_end(ops, fc2, o, attn.proj, x, self.ls1, self.norm2)
        if isinstance(mlp, SwiGLU):  # gate and value GEMMs on cuBLAS (biases included), then silu(gate) * value
            m = ops.swiglu(F.linear(h, mlp.fc1_g.weight, mlp.fc1_g.bias), F.linear(h, mlp.fc1_x.weight, mlp.fc1_x.bias))
        elif isinstance(mlp, SwiGLUPacked):  # no GEMM epilogue for the gate: cuBLAS, then the bias+SwiGLU kernel
            gv = F.linear(h, mlp.fc1.weight)
            m = ops.bias_swiglu(gv, mlp.fc1.bias) if mlp.fc1.bias is not None else ops.swiglu(*gv.chunk(2, dim=-1))
        elif fc1 == "epilogue":
            m = ops.linear_bias_gelu(h, mlp.fc1.weight, mlp.fc1.bias, form)
        elif form == "tanh":  # one cuBLASLt GEMM with bias + GELU (tanh form) as its epilogue
            m = linear_gelu_tanh(h, mlp.fc1.weight, mlp.fc1.bias)
        elif mlp.fc1.bias is not None and (fc1 == "bias_gelu" or form == "sigmoid"):
            # the bias + GELU kernel after a GEMM without bias: where the table measured it faster than PyTorch's
            # GELU (its erfc form for 16-bit), and always for QuickGELU, which is three PyTorch kernels
            m = ops.bias_gelu(F.linear(h, mlp.fc1.weight), mlp.fc1.bias, form)
        else:
            # cuBLAS adds the bias in its epilogue at no cost and PyTorch's GELU is one kernel: on the H100 this
            # beat fc1 without bias + the bias+GELU kernel with libdevice's erf (ViT-B/16 batch 256: 223 vs 263 us)
            m = mlp.act(F.linear(h, mlp.fc1.weight, mlp.fc1.bias))
        if type(mlp.norm) is not nn.Identity:
            m = _norm(ops, m, mlp.norm)
        return self._branch_end(ops, fc2, m, mlp.fc2, x, self.ls2, nxt) if nxt is not None else self._last_end(ops, fc2, m, x)

    @staticmethod
    def _branch_end(ops, path: str, y: torch.Tensor, linear: nn.Linear, x: torch.Tensor, ls: nn.Module, norm: nn.Module):
        """(r, norm(r)) with r = x + ls(linear(y)): one Triton GEMM, or cuBLAS + the add+LayerNorm (RMSNorm) kernel."""
        gamma = ls.gamma if isinstance(ls, LayerScale) else None
        rms = isinstance(norm, nn.RMSNorm)
        if path == "epilogue" and rms:
            return ops.linear_residual_rmsnorm(y, linear.weight, linear.bias, x, gamma, norm.weight, norm.eps)
        if path == "epilogue":
            return ops.linear_residual_layernorm(y, linear.weight, linear.bias, x, gamma, norm.weight, norm.bias, norm.eps)
        branch = F.linear(y, linear.weight, linear.bias)
        if rms:
            return ops.add_rmsnorm(x, branch, norm.weight, norm.eps, gamma)
        return ops.add_layernorm(x, branch, norm.weight, norm.bias, norm.eps, gamma)

    def _last_end(self, ops, path: str, m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x + ls2(fc2(m)) with no LayerNorm after it (the model's final norm runs as it is)."""
        fc2, gamma = self.mlp.fc2, self.ls2.gamma if isinstance(self.ls2, LayerScale) else None
        if path == "epilogue":
            return ops.linear_bias_residual(m, fc2.weight, fc2.bias, x, gamma)
        return x + self.ls2(F.linear(m, fc2.weight, fc2.bias))


def linear_gelu_tanh(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """gelu_tanh(h @ weight^T + bias), h [..., K], weight [N, K] -> [..., N].

    On CUDA one cuBLASLt GEMM with bias + GELU as its epilogue (`torch._addmm_activation`, whose
    GELU is the tanh form there: CUBLASLT_EPILOGUE_GELU_BIAS, or PyTorch's tanh GELU after the GEMM
    where cuBLASLt declines the shape). Its CPU kernel applies the erf form instead, so off CUDA
    (and without a bias) this is the GEMM then PyTorch's tanh GELU: the same function everywhere.
    """
    if not h.is_cuda or bias is None:
        return F.gelu(F.linear(h, weight, bias), approximate="tanh")
    y = torch._addmm_activation(bias, h.reshape(-1, h.shape[-1]), weight.t(), use_gelu=True)
    return y.view(*h.shape[:-1], weight.shape[0])


# ---------------------------------------------------------------------------- the patch embedding
class GemmPatchEmbed(nn.Module):
    """A `PatchEmbed` whose stride = kernel convolution runs as one GEMM over the unfolded patches.

    Patches do not overlap, so the im2col is a view, permute and one copy of the image; the GEMM is
    then [B*N, in_chans*p*p] x [in_chans*p*p, C] on cuBLAS. On the H100 (ViT-B/16 fp16, batch 256) cuDNN
    ran the convolution as a 1.5 ms implicit GEMM plus 0.6 ms of NCHW -> NHWC conversions, 8% of the
    forward, for 59 GFLOP (torch.profiler, benchmarks/results/gpu-proof-h100-18ef7c3). Same submodules
    (`proj`, `norm`) and so the same state_dict keys; the same sums in another order.
    """

    def __init__(self, embed: PatchEmbed):
        super().__init__()
        for name, child in embed.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "reference", embed)  # for restore() and its shape rules; not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, in_chans, H, W] -> [B, (H//p)*(W//p), C]; rows and columns past the last whole patch are dropped, as the conv drops them."""
        ref = self.reference
        check_image_shape(x, ref.in_chans, ref.img_size, ref.dynamic_patch)
        if type(self.proj) is not nn.Conv2d or _hooked(self.proj):  # replaced or hooked since: call it, as the reference does
            return self.norm(self.proj(x).flatten(2).transpose(1, 2))
        B, c, H, W = x.shape
        p = self.proj.kernel_size[0]
        x = x[:, :, : H // p * p, : W // p * p]  # a view: splitting H and W into patches below needs no copy
        patches = x.view(B, c, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), c * p * p)
        return self.norm(F.linear(patches, self.proj.weight.reshape(self.proj.out_channels, -1), self.proj.bias))


def can_gemm_embed(embed: nn.Module) -> bool:
    """The reference PatchEmbed with a square stride = kernel convolution and no padding or dilation."""
    if type(embed) is not PatchEmbed:
        return False
    conv = embed.proj
    k = conv.kernel_size
    return (k[0] == k[1] and tuple(conv.stride) == tuple(k) and tuple(conv.padding) == (0, 0) and tuple(conv.dilation) == (1, 1)
            and conv.groups == 1 and conv.padding_mode == "zeros")  # fmt: skip
