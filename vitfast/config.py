"""`ViTConfig`: one frozen, validated description of a Vision Transformer.

Field names follow timm's `VisionTransformer` arguments (`img_size`, `patch_size`, `embed_dim`,
...) and timm's preprocessing names (`mean`, `std`, `crop_pct`, `interpolation`), so a timm user
can read a config at a glance.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import numbers
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = (0.5, 0.5, 0.5)  # timm's name for the [-1, 1] normalisation of the original ViT
INCEPTION_STD = (0.5, 0.5, 0.5)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # the normalisation CLIP's image towers were trained with
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# class token, mean of patch tokens, attention pool (SigLIP), class token and mean patch token side by side
# (DINOv2's linear classifiers: Dinov2ForImageClassification), or "" (timm's name): no pooling, every token out
GLOBAL_POOLS = ("token", "avg", "map", "token_avg", "")
# timm's names: erf GELU, its tanh and sigmoid approximations; SiLU only as SwiGLU's gate
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
# "mlp": fc1 -> act -> fc2. "swiglu_packed": timm's SwiGLUPacked (DINOv2 giant): fc1 [2H, C] holds the gate and
# the value halves, silu(gate) * value -> fc2 [C, H]. "swiglu": timm's SwiGLU (AIMv2): the gate and value
# projections apart (fc1_g, fc1_x [H, C]), silu(fc1_g(x)) * fc1_x(x) -> fc2 [C, H]
MLP_LAYERS = ("mlp", "swiglu_packed", "swiglu")
# timm's names: LayerNorm, or RMSNorm (Zhang & Sennrich 2019: x / rms(x) * weight, no centring and no bias; AIMv2)
NORM_LAYERS = ("layernorm", "rmsnorm")
# Rotary position embeddings on the patch tokens' queries and keys (Su et al. 2021), 2-D: head_dim / 4 frequencies
# theta ** (-4i / head_dim) per image axis, y's then x's. "dinov3": DINOv3's form (patch centres in [-1, 1] per axis,
# angles 2 pi coord freq, rotate-half layout). "axial": EVA-02's and timm's other axial RoPE ViTs' (timm's
# RotaryEmbeddingCat: patch indices, scaled by rope_ref_grid / grid when fine-tuned at another size; angles coord freq;
# pairs (2j, 2j + 1) rotated together, the interleaved layout)
ROPE_KINDS = ("dinov3", "axial")
ROPE_THETA = {"dinov3": 100.0, "axial": 10000.0}  # each kind's default base period (rope_theta=None)
# Which image axis the first half of each head's rotary frequencies turns by (timm's rope_grid_indexing): "ij" y then x
# (DINOv3, EVA-02, timm's sbb RoPE ViTs), "xy" x then y (Naver's RoPE-ViT)
ROPE_GRID_INDEXINGS = ("ij", "xy")
ROPE_SETTINGS = ("rope_theta", "rope_ref_grid", "rope_grid_indexing", "rope_grid_offset")  # meaningful only with `rope`
MAP_POOL_SETTINGS = ("pool_include_prefix", "attn_pool_num_heads", "attn_pool_mlp_ratio")  # only with global_pool="map"
FEATURE_SETTINGS = ("out_indices", "output_fmt", "feature_norm", "feature_prefix_tokens")  # only with features_only=True
# Feature maps per image: channels first over the patch grid [C, gh, gw] (timm's default), or tokens [gh * gw, C]
OUTPUT_FMTS = ("NCHW", "NLC")
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
CROP_MODES = ("center", "squash", "border")  # timm's names: crop the short side, resize both sides, pad the short side
CROP_ROUNDINGS = ("round", "floor")  # centre-crop offset: torchvision/timm round, Hugging Face floors
# transformers' config.json `problem_type`: what a classifier's logits mean, so how they become scores
# (`vitfast.scores.default_scores`: softmax, a sigmoid per class, or the values themselves for regression)
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


@dataclass(frozen=True)
class ViTConfig:
    """A ViT / DeiT / hybrid / CLIP / DINOv2 / DINOv3 / SigLIP / AIMv2 ViT. Validated on construction; round-trips through JSON.

    `patch_size` is the total stride from pixels to tokens; an `img_size` that is not a multiple of it
    leaves its last pixels unseen, as in timm and transformers. For a hybrid model
    (`hybrid_layers` set) the ResNet-v2 stem reduces by `hybrid_stride(hybrid_layers)` (4 for the stem alone, else
    `4 * 2**(len(hybrid_layers) - 1)`) and the projection's kernel covers the rest (1 for timm's `*_r50_s16_*`, 8 for its R+Ti).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: str = "token"  # "map": multihead attention pooling with a learned query (timm's AttentionPoolLatent)
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    proj_bias: bool = True  # False: attention output projection and MLP Linears without bias (timm's name; AIMv2)
    init_values: float | None = None  # LayerScale init (DeiT-III); None = no layer scale
    class_token: bool = True
    distilled: bool = False  # DeiT distillation token and second head
    # False: the distillation token is there but only the class token is classified, by one head (transformers'
    # DeiTForImageClassification, unlike ...WithTeacher and timm's distilled models: the mean of two heads)
    dist_head: bool = True
    reg_tokens: int = 0  # register tokens (Darcet et al. 2023)
    no_embed_class: bool = False  # position embeddings cover patches only (DeiT-III, reg models)
    abs_pos_embed: bool = True  # False: no learned position embeddings added to the tokens (timm's use_abs_pos_emb; DINOv3)
    # timm's dynamic_img_size: `forward` takes images of any H x W in whole patches; the position embeddings (and rotary
    # tables) are fitted to each input's patch grid in every forward. img_size stays the size images are preprocessed to
    dynamic_img_size: bool = False
    # the patch grid pos_embed is stored at when it is not img_size's; only with dynamic_img_size (a fixed-size model holds
    # them at its own grid): a Hugging Face DINOv2 keeps its 37x37 table, which transformers resizes in every forward
    pos_embed_grid: tuple[int, int] | None = None
    # how pos_embed is resized to another grid: timm's antialiased bicubic (True), or transformers' plain bicubic (False;
    # all its models but Dinov2WithRegisters)
    pos_embed_antialias: bool = True
    rope: str | None = None  # rotary position embeddings in every attention, one of ROPE_KINDS (DINOv3, EVA-02); None = none
    rope_theta: float | None = None  # the rotary base period (timm's rope_temperature, transformers' rope_theta); None = the kind's
    rope_ref_grid: tuple[int, int] | None = None  # "axial": the grid positions are scaled to (EVA's ref_feat_shape); None = own grid
    rope_grid_indexing: str = "ij"  # one of ROPE_GRID_INDEXINGS: "xy" turns the first frequencies by x (Naver's RoPE-ViT)
    rope_grid_offset: float = 0.0  # "axial": added to each patch index before the reference-grid scaling (timm's name; PE: 1)
    scale_attn_norm: bool = False  # a norm on the attention output before its projection (timm's name; EVA-02 CLIP's sub-LN)
    scale_mlp_norm: bool = False  # a norm on the MLP's hidden activations before fc2 (timm's name; EVA-02 B/L)
    fc_norm: bool | None = None  # None: timm's rule, norm after pooling iff global_pool == "avg"
    pool_include_prefix: bool = False  # "map": the attention pool reads the class/register tokens too (timm's name; PE)
    attn_pool_num_heads: int | None = None  # "map": the attention pool's heads; None = num_heads (PE: 8)
    attn_pool_mlp_ratio: float | None = None  # "map": the attention pool's MLP width / embed_dim; None = mlp_ratio
    final_norm: bool = True  # False: no norm after the blocks nor after pooling (timm's RADIO, InternViT-300M)
    pre_norm: bool = False  # LayerNorm before the blocks, patch projection without bias (CLIP image towers)
    embed_norm: bool = False  # a norm on the patch tokens before the position embeddings (timm's embed_norm_layer; AIMv2)
    norm_layer: str = "layernorm"  # every norm of the model: "layernorm" or "rmsnorm" (AIMv2)
    representation_size: int | None = None  # pre-logits Linear + tanh of the original ViT head
    # timm's features_only: `forward` returns the patch tokens of the blocks `out_indices` as feature maps, stacked
    # [B, len, C, gh, gw] (or [B, len, gh * gw, C] with output_fmt="NLC"); the head and the blocks after the last
    # index are not built (timm's FeatureGetterNet prunes them too)
    features_only: bool = False
    out_indices: int | tuple[int, ...] = 3  # timm's: n = the last n blocks, or block indices (negative from the end)
    output_fmt: str = "NCHW"  # one of OUTPUT_FMTS
    feature_norm: bool = False  # the final norm on every feature map (timm's norm=True; DINOv2's get_intermediate_layers)
    # NLC maps keep the prefix (class, distillation, register) tokens before the patch tokens: [B, len, prefix + gh * gw,
    # C], every token of the block, as transformers' DINOv2 backbones return them with reshape_hidden_states=False (and
    # timm's forward_intermediates pairs them with return_prefix_tokens=True); DPT-style heads read the class token
    feature_prefix_tokens: bool = False
    norm_eps: float = 1e-6
    act_layer: str = "gelu"  # "gelu" (erf), "gelu_tanh" or "quick_gelu" (x sigmoid(1.702 x), OpenAI CLIP); "silu"
    mlp_layer: str = "mlp"  # "swiglu_packed": SwiGLU with fc1 packed (mlp_hidden is fc1's width, twice fc2's input);
    # "swiglu": SwiGLU with separate gate and value Linears (mlp_hidden is each one's width)
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    hybrid_layers: tuple[int, ...] | None = None  # ResNet-v2 stage depths, e.g. (3, 4, 9) for R50; () the stem alone (R+Ti)
    mean: tuple[float, ...] = INCEPTION_MEAN
    std: tuple[float, ...] = INCEPTION_STD
    crop_pct: float = 0.9
    interpolation: str = "bicubic"
    crop_mode: str = "center"
    crop_rounding: str = "round"
    # Images with transparency (RGBA, LA, P with a transparent colour) composited onto white before the RGB conversion, as
    # transformers' convert_to_rgb does in the processors with do_convert_rgb (CLIP, DINOv2's Bit, SigLIP). False: Pillow's
    # convert("RGB"), which drops alpha and keeps the colour under transparent pixels, as timm does
    alpha_on_white: bool = False
    name: str | None = field(default=None, compare=False)  # registry name it came from, if any
    labels: tuple[str, ...] | None = field(default=None, compare=False, repr=False)  # class names, by index
    problem_type: str | None = field(default=None, compare=False, repr=False)  # one of PROBLEM_TYPES; None: not said
    # The head projects the pooled features into an embedding space (CLIP's visual_projection, timm's CLIP towers under
    # their image-text tags, EVA-02 CLIP, Perception Encoder core): its num_classes outputs are an image embedding (CLIP's
    # image_embeds), not class logits, so nothing scores, ranks or labels them. Set by the checkpoint readers and the
    # registry; a num_classes override that changes the head's width makes a new head, a classifier (back to False)
    embedding_head: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        _check_types(self)
        # Normalise JSON lists into tuples so equal configs compare and hash equal.
        if isinstance(self.img_size, (list, tuple)):
            object.__setattr__(self, "img_size", tuple(int(s) if _is_int(s) else s for s in self.img_size))  # JSON, numpy ints
        elif _is_int(self.img_size):
            object.__setattr__(self, "img_size", int(self.img_size))
        for name in ("mean", "std"):
            values = tuple(float(v) for v in getattr(self, name))
            if len(values) != self.in_chans and len(set(values)) == 1:
                values = values[:1] * self.in_chans  # a uniform normalisation fits any channel count
            object.__setattr__(self, name, values)
        if self.hybrid_layers is not None:
            object.__setattr__(self, "hybrid_layers", tuple(int(d) for d in self.hybrid_layers))
        for name in ("rope_ref_grid", "pos_embed_grid"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.out_indices, list):
            object.__setattr__(self, "out_indices", tuple(self.out_indices))
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(str(label) for label in self.labels))
        self._validate()

    # ---------------------------------------------------------------- derived sizes
    @property
    def img_hw(self) -> tuple[int, int]:
        return (self.img_size, self.img_size) if isinstance(self.img_size, int) else self.img_size

    @property
    def grid_size(self) -> tuple[int, int]:
        h, w = self.img_hw
        return h // self.patch_size, w // self.patch_size

    @property
    def pos_grid(self) -> tuple[int, int]:
        """The patch grid `pos_embed` is stored at: `pos_embed_grid`, else img_size's."""
        return self.pos_embed_grid or self.grid_size

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid_size
        return gh * gw

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def seq_len(self) -> int:
        return self.num_patches + self.num_prefix_tokens

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def rope_base(self) -> float | None:
        """The rotary base period in use: `rope_theta`, else the kind's default (None without rotary positions)."""
        return None if self.rope is None else self.rope_theta if self.rope_theta is not None else ROPE_THETA[self.rope]

    @property
    def mlp_hidden(self) -> int:
        return int(round(self.embed_dim * self.mlp_ratio))

    @property
    def pool_mlp_hidden(self) -> int:
        """The attention pool's ("map") MLP width: `attn_pool_mlp_ratio`'s, else the blocks' (`mlp_hidden`)."""
        return self.mlp_hidden if self.attn_pool_mlp_ratio is None else round(self.embed_dim * self.attn_pool_mlp_ratio)

    @property
    def num_features(self) -> int:
        """Width of the pooled features the head reads (2 x embed_dim for "token_avg")."""
        return 2 * self.embed_dim if self.global_pool == "token_avg" else self.embed_dim

    @property
    def out_features(self) -> int:
        """Width of `forward`'s output: the classes, else the pre-logits width, else the pooled features."""
        return self.num_classes or self.representation_size or self.num_features

    @property
    def feature_indices(self) -> tuple[int, ...]:
        """The blocks whose outputs `features_only` returns, counted from 0, in block order (empty without features_only)."""
        return take_indices(self.depth, self.out_indices) if self.features_only else ()

    @property
    def built_depth(self) -> int:
        """The blocks a model of this config builds: all, or with features_only those up to the last feature map."""
        return self.feature_indices[-1] + 1 if self.features_only else self.depth

    @property
    def output_shape(self) -> tuple[int | None, ...]:
        """`forward`'s output per image: (out_features,); (seq_len, out_features) per token with global_pool="";
        with features_only, one feature map per index: (n, embed_dim, gh, gw), or (n, gh * gw, embed_dim) for "NLC".
        With dynamic_img_size the sizes that follow the input's patch grid are None."""
        grid, patches, tokens = self.grid_size, self.num_patches, self.seq_len
        if self.dynamic_img_size:
            grid, patches, tokens = (None, None), None, None
        if self.features_only:
            n = len(self.feature_indices)
            if self.output_fmt == "NCHW":
                return (n, self.embed_dim, *grid)
            return (n, tokens if self.feature_prefix_tokens else patches, self.embed_dim)
        return (tokens, self.out_features) if self.global_pool == "" else (self.out_features,)

    @property
    def channel_axis(self) -> int:
        """The axis of `forward`'s output [B, *output_shape] that holds the features (2 for NCHW feature maps, else the last)."""
        return 2 if self.features_only and self.output_fmt == "NCHW" else -1

    @property
    def classifies(self) -> bool:
        """One set of class scores per image: a classifier over pooled features (not features, not per-token logits, not an
        image embedding: `embedding_head`)."""
        return bool(self.num_classes) and self.global_pool != "" and not self.features_only and not self.embedding_head

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm

    @property
    def hybrid_reduction(self) -> int:
        """Stride of the ResNet-v2 stem (1 for a plain ViT)."""
        return 1 if self.hybrid_layers is None else hybrid_stride(self.hybrid_layers)

    # ---------------------------------------------------------------- validation
    def _validate(self) -> None:
        def bad(msg: str) -> None:
            raise ConfigError(f"invalid ViTConfig{f' {self.name!r}' if self.name else ''}: {msg}")

        size = self.img_size
        if not (_is_int(size) or isinstance(size, tuple) and len(size) == 2 and all(_is_int(s) for s in size)):
            bad(f"img_size must be a positive int or (height, width) ints, got {size!r}; e.g. img_size=224 or img_size=(224, 320)")
        hw = self.img_hw
        if min(hw) <= 0:
            bad(f"img_size must be a positive int or (height, width), got {self.img_size!r}")
        for key in ("patch_size", "in_chans", "embed_dim", "depth", "num_heads"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) <= 0:
                bad(f"{key} must be a positive integer, got {getattr(self, key)!r}")
        if min(hw) < self.patch_size:
            bad(f"img_size {hw[0]}x{hw[1]} is smaller than one {self.patch_size}x{self.patch_size} patch")
        # Pixels past the last whole patch are ignored, as timm and transformers do (SigLIP so400m/14 at 384 px
        # sees 27x27 patches = 378 px); a hybrid stem pads instead, so it needs whole patches.
        if self.hybrid_layers is not None and (hw[0] % self.patch_size or hw[1] % self.patch_size):
            fit = [s // self.patch_size * self.patch_size for s in hw]
            bad(
                f"img_size {hw[0]}x{hw[1]} of a hybrid model is not divisible by patch_size {self.patch_size}; "
                f"use a multiple of {self.patch_size}, e.g. img_size={fit[0] if fit[0] == fit[1] else tuple(fit)}"
            )
        if self.embed_dim % self.num_heads:
            divisors = [h for h in range(1, self.embed_dim + 1) if self.embed_dim % h == 0]
            close = sorted(divisors, key=lambda h: abs(h - self.num_heads))[:3]
            bad(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}; "
                f"num_heads that divide it: {', '.join(map(str, sorted(close)))}"
            )
        if self.num_classes < 0:
            bad(f"num_classes must be >= 0 (0 = no classifier), got {self.num_classes}")
        if self.mlp_ratio <= 0 or self.mlp_hidden <= 0:
            bad(f"mlp_ratio must be > 0, got {self.mlp_ratio}")
        if self.global_pool not in GLOBAL_POOLS:
            bad(f"global_pool must be one of {GLOBAL_POOLS}, got {self.global_pool!r}")
        if self.global_pool in ("token", "token_avg") and not self.class_token:
            bad(f'global_pool="{self.global_pool}" needs class_token=True; use global_pool="avg" without a class token')
        if self.global_pool == "token_avg" and self.fc_norm:
            bad('fc_norm is not supported with global_pool="token_avg" (the final norm runs before pooling, as in DINOv2)')
        if self.fc_norm and not self.final_norm:
            bad("fc_norm=True asks for the norm after pooling that final_norm=False removes; drop one of them")
        if self.distilled and not (self.class_token and self.global_pool == "token"):
            bad('distilled (DeiT) models need class_token=True and global_pool="token"')
        if not self.dist_head and not self.distilled:
            bad("dist_head=False leaves out the distillation token's head; it needs distilled=True (or drop dist_head)")
        if self.reg_tokens < 0:
            bad(f"reg_tokens must be >= 0, got {self.reg_tokens}")
        if self.act_layer not in ACT_LAYERS:
            bad(f"act_layer must be one of {ACT_LAYERS}, got {self.act_layer!r}")
        if self.mlp_layer not in MLP_LAYERS:
            bad(f"mlp_layer must be one of {MLP_LAYERS}, got {self.mlp_layer!r}")
        swiglu = self.mlp_layer in ("swiglu_packed", "swiglu")
        if swiglu != (self.act_layer == "silu"):
            bad(f'mlp_layer="swiglu_packed" or "swiglu" goes with act_layer="silu" (its gate), and SiLU only with them; got '
                f"mlp_layer={self.mlp_layer!r}, act_layer={self.act_layer!r}")  # fmt: skip
        if self.mlp_layer == "swiglu_packed" and self.mlp_hidden % 2:
            bad(f"swiglu_packed needs an even MLP width (gate and value halves), got {self.mlp_hidden} from mlp_ratio {self.mlp_ratio}")
        if swiglu and self.global_pool == "map":
            bad(f'mlp_layer="{self.mlp_layer}" with global_pool="map" is not supported (the attention pool\'s MLP is a GELU MLP)')
        if self.norm_layer not in NORM_LAYERS:
            bad(f"norm_layer must be one of {NORM_LAYERS}, got {self.norm_layer!r}")
        if self.embed_norm and self.hybrid_layers is not None:
            bad("embed_norm is not supported with a hybrid (ResNet) stem; it normalises plain patch embeddings")
        if self.rope is not None and self.rope not in ROPE_KINDS:
            bad(f"rope must be None or one of {ROPE_KINDS}, got {self.rope!r}")
        if self.rope is not None and self.head_dim % 4:
            bad(f"rope={self.rope!r} needs a head_dim divisible by 4 (a quarter of it per image axis for sine and cosine), "
                f"got {self.head_dim} = {self.embed_dim} / {self.num_heads}")  # fmt: skip
        if self.rope_theta is not None and not self.rope_theta > 0:
            bad(f"rope_theta must be > 0 (or None: the kind's default), got {self.rope_theta}")
        if self.rope_ref_grid is not None:
            if self.rope != "axial":
                bad(f'rope_ref_grid scales the patch indices of rope="axial" only; got rope={self.rope!r}')
            if len(self.rope_ref_grid) != 2 or not all(isinstance(s, int) and s > 0 for s in self.rope_ref_grid):
                bad(f"rope_ref_grid must be two positive integers (rows, columns), got {self.rope_ref_grid!r}")
        if self.rope_grid_offset and self.rope != "axial":
            bad(f'rope_grid_offset shifts the patch indices of rope="axial" only; got rope={self.rope!r}')
        map_only = [k for k in MAP_POOL_SETTINGS if getattr(self, k) not in (None, False)]
        if map_only and self.global_pool != "map":
            bad(f'{", ".join(map_only)} configure the attention pool (global_pool="map"); got global_pool={self.global_pool!r}')
        if self.attn_pool_num_heads is not None and (self.attn_pool_num_heads < 1 or self.embed_dim % self.attn_pool_num_heads):
            bad(f"attn_pool_num_heads must divide embed_dim {self.embed_dim}, got {self.attn_pool_num_heads}")
        if self.attn_pool_mlp_ratio is not None and not self.attn_pool_mlp_ratio > 0:
            bad(f"attn_pool_mlp_ratio must be > 0 (or None: mlp_ratio), got {self.attn_pool_mlp_ratio}")
        self._validate_features(bad)
        if self.pos_embed_grid is not None:
            if not (self.dynamic_img_size and self.abs_pos_embed):
                bad("pos_embed_grid is the stored grid of the position embeddings a dynamic_img_size model resizes in every forward; "
                    "it needs dynamic_img_size=True and abs_pos_embed=True (a fixed-size model holds them at its own grid)")  # fmt: skip
            if len(self.pos_embed_grid) != 2 or not all(isinstance(s, int) and s > 0 for s in self.pos_embed_grid):
                bad(f"pos_embed_grid must be two positive integers (rows, columns), got {self.pos_embed_grid!r}")
        if self.rope_grid_indexing not in ROPE_GRID_INDEXINGS:
            bad(f"rope_grid_indexing must be one of {ROPE_GRID_INDEXINGS}, got {self.rope_grid_indexing!r}")
        if self.rope_grid_indexing != "ij" and self.rope is None:
            bad(f"rope_grid_indexing={self.rope_grid_indexing!r} orders rotary frequencies; this config has no rotary positions (rope=None)")
        if self.interpolation not in INTERPOLATIONS:
            bad(f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        if self.crop_mode not in CROP_MODES:
            bad(f"crop_mode must be one of {CROP_MODES}, got {self.crop_mode!r}")
        if self.crop_rounding not in CROP_ROUNDINGS:
            bad(f"crop_rounding must be one of {CROP_ROUNDINGS}, got {self.crop_rounding!r}")
        if self.labels is not None and len(self.labels) != self.num_classes:
            bad(
                f"{len(self.labels)} labels for {self.num_classes} classes; give one label per class "
                "(or labels=None)"
            )
        if self.embedding_head and not self.num_classes:
            bad("embedding_head=True says the head projects the pooled features into an image embedding; this config has no head "
                "(num_classes=0): drop embedding_head")  # fmt: skip
        if self.embedding_head and (self.labels is not None or self.problem_type is not None):
            given = " and ".join(k for k in OUTPUT_MEANING_FIELDS if k != "embedding_head" and getattr(self, k) is not None)
            bad(f"{given} describe class logits, and this model's head returns an image embedding (embedding_head=True: CLIP's "
                f"image_embeds), not {self.num_classes} classes: drop {given}")  # fmt: skip
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            bad(f"problem_type must be one of {', '.join(PROBLEM_TYPES)} (transformers' names) or None, got {self.problem_type!r}")
        if self.labels is not None and any("\n" in label or "\r" in label for label in self.labels):
            bad("labels must not contain line breaks (they are written one per line for Triton)")
        if not 0 < self.crop_pct <= 1:
            bad(f"crop_pct must be in (0, 1], got {self.crop_pct}")
        if not self.norm_eps > 0:
            bad(f"norm_eps must be > 0, got {self.norm_eps}")
        for key in ("drop_rate", "pos_drop_rate", "attn_drop_rate", "proj_drop_rate", "drop_path_rate"):
            if not 0 <= getattr(self, key) < 1:
                bad(f"{key} must be in [0, 1), got {getattr(self, key)}")
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            bad(
                f"mean and std need one value per input channel ({self.in_chans}), got {self.mean} and {self.std}; "
                f"pass mean= and std= with {self.in_chans} values"
            )
        if any(s <= 0 for s in self.std):
            bad(f"std values must be > 0, got {self.std}")
        if self.representation_size is not None and self.representation_size <= 0:
            bad(f"representation_size must be > 0 or None, got {self.representation_size}")
        if self.representation_size is not None and self.distilled:
            bad("representation_size (pre-logits) is not supported together with distilled=True")
        if self.hybrid_layers is not None:
            if any(d <= 0 for d in self.hybrid_layers):
                bad(f"hybrid_layers must be positive stage depths (() for the stem alone), got {self.hybrid_layers}")
            if self.patch_size % self.hybrid_reduction:
                bad(
                    f"patch_size {self.patch_size} must be a multiple of the hybrid stem's stride "
                    f"{self.hybrid_reduction} (hybrid_layers={self.hybrid_layers})"
                )

    def _validate_features(self, bad) -> None:
        if not self.features_only:
            given = [k for k in FEATURE_SETTINGS if getattr(self, k) != self.__dataclass_fields__[k].default]
            if given:
                bad(f"{', '.join(given)} configure the feature maps of features_only=True; set features_only=True or drop them")
            return
        d, idx = self.depth, self.out_indices
        if isinstance(idx, bool) or not isinstance(idx, (int, tuple)) or (isinstance(idx, tuple) and not all(
                isinstance(i, int) and not isinstance(i, bool) for i in idx)):  # fmt: skip
            bad(f"out_indices must be a number of last blocks or a tuple of block indices, got {idx!r}")
        try:
            blocks = take_indices(d, idx)
        except ValueError as exc:
            bad(f"out_indices {exc}")
        if isinstance(idx, tuple) and [i % d for i in idx] != list(blocks):
            bad(f"out_indices {idx} are blocks {[i % d for i in idx]}: give each block once, in block order (feature maps come out in "
                f"block order), e.g. {blocks}")  # fmt: skip
        if self.output_fmt not in OUTPUT_FMTS:
            bad(f"output_fmt must be one of {OUTPUT_FMTS}, got {self.output_fmt!r}")
        if self.feature_prefix_tokens and (self.output_fmt != "NLC" or not self.num_prefix_tokens):
            bad("feature_prefix_tokens keeps the class and register tokens in each map's token sequence: it needs output_fmt='NLC' "
                f"(this model has {self.output_fmt!r}) and a model with such tokens (this one has {self.num_prefix_tokens})")  # fmt: skip
        if self.feature_norm and not (self.final_norm and not self.use_fc_norm):
            where = "after pooling (fc_norm)" if self.final_norm else "nowhere (final_norm=False)"
            bad(f"feature_norm applies the final norm to the feature maps, and this model's final norm is {where}: timm's norm=True "
                "would change nothing; drop feature_norm")  # fmt: skip

    # ---------------------------------------------------------------- (de)serialisation
    def replace(self, **overrides: Any) -> "ViTConfig":
        """A copy with some fields changed (unknown field names raise `ConfigError`). Settings of what an
        override removes go back to their defaults unless given too: labels that no longer fit a new
        `num_classes`, `embedding_head` with a `num_classes` that changes the head (a new head is a classifier), the rotary settings with `rope=None`, the attention pool's with a pool other than "map", the
        feature maps' with `features_only=False`."""
        check_field_names(overrides)
        if self.embedding_head and overrides.get("num_classes", self.num_classes) != self.num_classes and "embedding_head" not in overrides:
            overrides = {**overrides, "embedding_head": False}  # a head of another width is a new one: a classifier (fine-tuning)
        if "labels" not in overrides and self.labels and overrides.get("num_classes", self.num_classes) != len(self.labels):
            overrides = {**overrides, "labels": None}
        removed = (ROPE_SETTINGS if "rope" in overrides and overrides["rope"] is None else ()) + (
            MAP_POOL_SETTINGS if overrides.get("global_pool", "map") != "map" else ()) + (
            FEATURE_SETTINGS if overrides.get("features_only", True) is False else ())
        defaults = {k: self.__dataclass_fields__[k].default for k in removed}
        return dataclasses.replace(self, **(defaults | overrides))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ViTConfig":
        check_field_names(data)
        return cls(**data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "ViTConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)


def _is_int(value: Any) -> bool:
    """An integer, Python's or numpy's, and not a bool (nor a float such as 224.0: an image has whole pixels)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_KINDS = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
          str: ("a string", "strings"), type(None): ("null", "nulls")}
_OWN_CHECKS = ("img_size", "out_indices")  # `_validate` says what their int-or-list forms must be


def _check_types(config: ViTConfig) -> None:
    """Each field of the type it is declared with (a `--config` JSON's `"mean": 0.5` or `"labels": "l.txt"`): a
    `ConfigError` naming the field, the type and the value, not a crash later or a string read as a list of characters."""
    hints = _field_types()
    for f in dataclasses.fields(ViTConfig):
        value = getattr(config, f.name)
        if f.name not in _OWN_CHECKS and not _fits(value, hints[f.name]):
            hint = " (a labels file goes in --labels FILE)" if f.name == "labels" and isinstance(value, str) else ""
            name = f" {config.name!r}" if isinstance(config.name, str) else ""
            raise ConfigError(f"invalid ViTConfig{name}: {f.name} must be {_describe(hints[f.name])}, got {value!r}{hint}")


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(ViTConfig)  # evaluated once: every config made (each `replace`) is checked


def _fits(value: Any, hint: Any) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:  # tuple[X, ...] or tuple[X, X]: JSON gives a list; `_validate` checks lengths
        return isinstance(value, (list, tuple)) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if hint is int:
        return _is_int(value)
    if hint is float:  # numpy's floats too, and whole numbers (1 for 1.0)
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"a list of {_KINDS[typing.get_args(hint)[0]][1]}"
    return _KINDS[hint][0]


def take_indices(depth: int, indices: int | tuple[int, ...] | list[int] | None) -> tuple[int, ...]:
    """timm's `feature_take_indices`: None = every block, n = the last n, else the given blocks (negative from the
    end), each once, in block order. ValueError names what is out of range."""
    if indices is None:
        indices = depth
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"{indices} asks for the last {indices} blocks; the model has {depth}: give 1 to {depth}")
        return tuple(range(depth - indices, depth))
    if not indices or any(not -depth <= i < depth for i in indices):
        raise ValueError(f"{tuple(indices)} must be one or more block indices in [{-depth}, {depth - 1}] (negative from the end)")
    return tuple(sorted({i % depth for i in indices}))


def hybrid_stride(layers: tuple[int, ...]) -> int:
    """Stride of a ResNet-v2 stem with `layers` stage depths: 4 from the stem itself (7x7/2 conv, 3x3/2 max-pool), then 2
    per stage after the first; () is the stem alone (timm's R+Ti hybrids, `_resnetv2(layers=())`)."""
    return 4 * 2 ** max(len(layers) - 1, 0)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ViTConfig))
# Everything `vitfast.preprocess` reads besides the image size and channels.
PREPROCESSING_FIELDS = ("mean", "std", "crop_pct", "interpolation", "crop_mode", "crop_rounding", "alpha_on_white")
# What a model's output means, not how it is computed: any artifact takes them from the user (class names by index,
# how to score the logits, or that the output is an image embedding rather than logits).
OUTPUT_MEANING_FIELDS = ("labels", "problem_type", "embedding_head")


def check_field_names(data: dict[str, Any]) -> None:
    unknown = [k for k in data if k not in FIELD_NAMES]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, FIELD_NAMES, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"unknown ViTConfig field(s): {', '.join(hints)}")
