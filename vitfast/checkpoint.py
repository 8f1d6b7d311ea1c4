"""Loading and saving checkpoints: vitfast, timm and Hugging Face formats, auto-detected.

Nothing pickled is ever executed: `.pth`/`.bin` files go through `torch.load(weights_only=True)`
and safetensors is preferred everywhere.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ._version import __version__
from .atomic import atomic_write
from .config import ViTConfig
from . import dinov3
from .data import IMAGE_SUFFIXES
from .convert import (
    Guesses, StateDict, detect_format, has_clip_projection, hf_config_to_vit, hf_to_timm, read_hf_state_dict, read_timm_hub, timm_config,
    timm_layout,
)  # fmt: skip
from .errors import CheckpointError, ConfigError, GuessedConfigWarning, first_line
from .model import VisionTransformer
from .pos_embed import resample_pos_embed

FORMAT_TAG = "vitfast"
WEIGHTS = "weights"  # the guess that names which of a training checkpoint's weights were loaded (not a config field)
MAX_LISTED = 12  # keys shown per category in a mismatch error


def save_checkpoint(model: torch.nn.Module, path: str | os.PathLike) -> Path:
    """Write `model`'s weights as safetensors with its `ViTConfig` JSON in the metadata.

    The file is written under a temporary name and renamed, so a failure leaves no partial file.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ViTConfig):
        raise ConfigError("save_checkpoint needs a vitfast model (one with a ViTConfig in .config)")
    path = Path(path)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": FORMAT_TAG, "vitfast_version": __version__, "config": config.to_json()}
    # still guesses: say so again when it is loaded (not which weights a training checkpoint gave: this file holds those alone)
    if guesses := {k: v for k, v in (getattr(model, "config_guesses", None) or {}).items() if k != WEIGHTS}:
        metadata["guessed"] = json.dumps(guesses)
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_checkpoint(
    path: str | os.PathLike,
    *,
    config: ViTConfig | None = None,
    img_size: int | tuple[int, int] | None = None,
    overrides: dict[str, Any] | None = None,
    use_ema: bool = True,
):
    """Load a reference `VisionTransformer` (eval mode) from any supported checkpoint.

    Formats, detected from the contents:
      - vitfast: safetensors written by `save_checkpoint` (config in the metadata);
      - timm: a state dict (`.pth`/`.bin`/`.safetensors`, keys like `blocks.0.attn.qkv.weight`),
        config given or inferred from tensor shapes; or a timm Hub folder (`config.json` with
        `architecture` and `pretrained_cfg`, beside `model.safetensors` / `pytorch_model.bin`);
        timm's eva.py DINOv3 (`vit_*_patch16_dinov3*`) included;
      - Meta's original DINOv3 `.pth` (facebookresearch/dinov3: `storage_tokens`, `rope_embed.periods`) and DINOv2
        `.pth` (facebookresearch/dinov2: timm's names beside `mask_token`, `register_tokens`, the giant's `mlp.w12`);
      - Hugging Face: a `ViTForImageClassification`/`ViTModel`/DeiT/DINOv2/CLIP/SigLIP/AIMv2 directory (`config.json`,
        `preprocessor_config.json`, `model.safetensors` or `pytorch_model.bin`, sharded or not)
        or such a state dict alone.
    `config` replaces the detected config; `overrides` changes some of its fields (e.g.
    `{"num_heads": 12, "mean": (0.485, 0.456, 0.406)}`). Whatever the checkpoint did not store
    and was not given is guessed: listed in `model.config_guesses` ({field: reason}) and warned
    about (`GuessedConfigWarning`). `img_size` (or a config whose patch grid differs from the
    checkpoint's) resizes the position embeddings bicubically over the patch grid, keeping
    class/distillation/register tokens apart: timm's antialiased resize for timm and vitfast
    checkpoints, Hugging Face's `interpolate_pos_encoding` for HF ones.
    A training checkpoint holding the weights' EMA beside them (timm's `state_dict_ema` or `model_ema`) loads the EMA,
    as timm's `load_checkpoint(use_ema=True)` does, and says so (`model.config_guesses["weights"]`); `use_ema=False`
    loads the trained weights instead.
    """
    path = Path(path)
    if config is not None and not isinstance(config, ViTConfig):
        raise ConfigError(f"config must be a ViTConfig, got {type(config).__name__}")
    stated = overrides or {}
    source_cfg, sd, fmt, guesses = _read(path, given=config, num_heads=stated.get("num_heads"), rope=stated.get("rope"), use_ema=use_ema)
    if config is not None:  # nothing about the config is guessed; which weights were taken still is
        cfg, guesses = config, {k: v for k, v in guesses.items() if k == WEIGHTS}
    else:
        cfg = source_cfg
    overridden = None  # (config before, after) the overrides, which may be what does not fit
    if overrides:
        before, cfg = cfg, cfg.replace(**_head_overrides(cfg, overrides))
        overridden = (before, cfg)
        sd = _reset_classifier(sd, before, cfg, path)
        guesses = {k: v for k, v in guesses.items() if k not in overrides}
    if img_size is not None:
        cfg = cfg.replace(img_size=img_size)
        guesses = {k: v for k, v in guesses.items() if k != "img_size"}
    if "pos_embed" in sd:
        # transformers resizes without antialiasing, except in Dinov2WithRegisters (its only model with registers)
        antialias = fmt != "hf" or source_cfg.reg_tokens > 0
        if fmt == "hf" and cfg.dynamic_img_size:
            cfg = _keep_hf_pos_embed(cfg, sd["pos_embed"], source_cfg, antialias, stated)
        sd["pos_embed"] = _fit_pos_embed(sd["pos_embed"], source_cfg, cfg, antialias=antialias)
    model = VisionTransformer(cfg)
    sd = _drop_pruned(sd, cfg)
    _check_keys(sd, model.state_dict(), path, cfg, given=config is not None, overridden=overridden)
    model.load_state_dict(sd, strict=True)
    model.config_guesses = guesses
    if guesses:
        warnings.warn(GuessedConfigWarning(describe_guesses(path, cfg, guesses)), stacklevel=2)
    return model.eval()


def _head_overrides(cfg: ViTConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """A new global_pool keeps the final norm where the checkpoint has it (before pooling, or after it as
    fc_norm), as timm's `reset_classifier` does; by default its placement follows the pool. Unpooled tokens with
    no classifier are the final norm's, transformers' `last_hidden_state`: a pre-logits layer (a ViTModel's
    pooler) is dropped with the pool."""
    implied: dict[str, Any] = {}
    if "global_pool" in overrides and "fc_norm" not in overrides and cfg.fc_norm is None and cfg.final_norm:
        implied["fc_norm"] = cfg.use_fc_norm
    unpooled = overrides.get("global_pool") == "" and not overrides.get("num_classes", cfg.num_classes)
    if unpooled and cfg.representation_size and "representation_size" not in overrides:
        implied["representation_size"] = None
    return implied | overrides


def _reset_classifier(sd: StateDict, before: ViTConfig, after: ViTConfig, path: Path) -> StateDict:
    """The checkpoint's weights for the head of `after`, `before` changed by overrides (timm's `reset_classifier` for inference):
    num_classes=0 drops the classifier, a pool other than "map" drops the attention pool, no representation_size the
    pre-logits layer. A classifier of another size, or one that would read features of another width, has no trained
    weights: refused."""
    if after.num_classes not in (0, before.num_classes):
        raise ConfigError(f"{path} has a {before.num_classes}-class classifier; num_classes={after.num_classes} would need a new, "
                          f"untrained one. Pass num_classes=0 (features, no classifier) or {before.num_classes}")  # fmt: skip
    if after.num_classes and after.num_features != before.num_features:
        raise ConfigError(f"{path}'s classifier reads {before.num_features} features (global_pool={before.global_pool!r}); "
                          f"global_pool={after.global_pool!r} gives {after.num_features}. Pass num_classes=0 as well (features, no classifier)")  # fmt: skip
    if after.num_classes and after.representation_size != before.representation_size:
        raise ConfigError(f"{path}'s classifier was trained on representation_size={before.representation_size} (its pre-logits layer); "
                          f"representation_size={after.representation_size} would feed it other features. Pass num_classes=0 as well (features, no classifier)")  # fmt: skip
    dropped = ("head.", "head_dist.") if before.num_classes and not after.num_classes else ()
    dropped += ("attn_pool.",) if before.global_pool == "map" and after.global_pool != "map" else ()
    dropped += ("pre_logits.",) if before.representation_size and not after.representation_size else ()
    return {k: v for k, v in sd.items() if not k.startswith(dropped)} if dropped else sd


def _shapes(cfg: ViTConfig) -> dict[str, torch.Size]:
    """The parameters and buffers of `cfg`'s model, by name, and their shapes (nothing allocated)."""
    with torch.device("meta"):
        return {k: v.shape for k, v in VisionTransformer(cfg).state_dict().items()}


def _drop_pruned(sd: StateDict, cfg: ViTConfig) -> StateDict:
    """features_only builds no head and no blocks after the last feature map (timm's FeatureGetterNet prunes them
    too): the checkpoint's weights for those are left out. Anything else that does not fit is still reported."""
    if not cfg.features_only:
        return sd
    with torch.device("meta"):
        whole = VisionTransformer(cfg.replace(features_only=False)).state_dict()
        kept = VisionTransformer(cfg).state_dict()
    return {k: v for k, v in sd.items() if k in kept or k not in whole}


def describe_guesses(path: str | os.PathLike, cfg: ViTConfig, guesses: Guesses) -> str:
    """One line: the guessed values grouped by reason, and how to set them."""
    by_reason: dict[str, list[str]] = {}
    for key, reason in guesses.items():
        value = getattr(cfg, key, None)
        by_reason.setdefault(reason, []).append(key if key == WEIGHTS else f"{key}={list(value) if isinstance(value, tuple) else value!r}")
    parts = "; ".join(f"{', '.join(keys)} ({reason})" for reason, keys in by_reason.items())
    if set(guesses) == {WEIGHTS}:  # no config field guessed: the note says how to take the other weights
        return f"{path}: {parts}"
    return (
        f"{path}: guessed {parts}. If a value is wrong, pass --config FILE.json or the field's flag "
        "(--num-heads, --act-layer, --norm-eps, --mean, --std, --crop-pct, --crop-mode, --interpolation, --num-classes); "
        "config=/overrides= in Python"
    )


# ---------------------------------------------------------------------------- reading
def _read(path: Path, *, given: ViTConfig | None = None, num_heads: int | None = None, rope: str | None = None,
          use_ema: bool = True) -> tuple[ViTConfig, StateDict, str, Guesses]:  # fmt: skip
    """(config stored or inferred, state dict in timm names, 'vitfast' | 'timm' | 'hf', what was guessed).

    A bare state dict is not read for a config when one is `given` (the shapes may not tell it: an
    unusual head width, a non-square grid); `num_heads`, when the caller knows it, is not guessed;
    `rope` (an override's), or the given config's, says which rotary positions timm weights have; `use_ema`: see `_unwrap`,
    whose note on the weights it chose is a guess under `WEIGHTS`."""
    if path.is_dir():
        return _read_dir(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    sd, metadata = _read_tensors(path)
    if metadata.get("format") == FORMAT_TAG and "config" in metadata:
        try:
            return ViTConfig.from_json(metadata["config"]), sd, FORMAT_TAG, json.loads(metadata.get("guessed", "{}"))
        except (ConfigError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: the config stored in this vitfast checkpoint is invalid: {exc}") from None
    sd, chosen = _unwrap(sd, use_ema)
    cfg, sd, fmt, guesses = _read_state_dict(sd, path, given, num_heads, rope)
    return cfg, sd, fmt, guesses | ({WEIGHTS: chosen} if chosen else {})


def _read_state_dict(sd: StateDict, path: Path, given: ViTConfig | None, num_heads: int | None,
                     rope: str | None) -> tuple[ViTConfig, StateDict, str, Guesses]:  # fmt: skip
    """`_read` of an unwrapped state dict."""
    if dinov3.is_meta(sd):  # timm's patch_embed.proj, but Meta's own names beside it
        sd, cfg, guesses = dinov3.read_meta(sd, given=given, num_heads=num_heads)
        return cfg, sd, "timm", guesses
    fmt = detect_format(sd)
    family = None
    if fmt == "timm":
        sd, family = timm_layout(sd, path, rope=given.rope if given is not None else rope)
    if given is not None:
        return given, hf_to_timm(sd) if fmt == "hf" else sd, fmt, {}
    if fmt == "hf":
        sd, cfg, guesses = read_hf_state_dict(sd, num_heads=num_heads)
        return cfg, sd, "hf", guesses
    cfg, guesses = timm_config(sd, family, num_heads)
    return cfg, sd, "timm", guesses


def _refuse_triton_repository(path: Path) -> None:
    """A Triton model repository (`export --format triton-repo` writes one: a folder per model, each with its
    config.pbtxt) is no model itself: the error names the model file in it, and the server that runs the whole."""
    if next(path.glob("*/config.pbtxt"), None) is None:
        return
    files = sorted(path.glob("*/[0-9]*/model.onnx")) + sorted(path.glob("*/[0-9]*/model.plan"))
    take = f"give vitfast the model file in it, {files[0]}" if files else "vitfast takes a model file (.onnx, .plan), and it holds none"
    raise CheckpointError(f"{path} is a Triton model repository (a folder per model with its config.pbtxt), not a model: {take}; "
                          f"or run the whole repository with: tritonserver --model-repository {path}")  # fmt: skip


def _read_dir(path: Path) -> tuple[ViTConfig, StateDict, str, Guesses]:
    """A Hugging Face model folder or a timm Hub folder (config.json with `architecture`)."""
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        _refuse_triton_repository(path)
        raise CheckpointError(
            f"{path} is a directory without config.json; expected a Hugging Face or timm Hub model folder"
        )
    hub_cfg = _read_json(cfg_file)
    sd = _read_dir_weights(path)
    if "architecture" in hub_cfg:  # timm's save_for_hf / push_to_hf_hub layout
        sd = _unwrap(sd)[0]  # a Hub folder holds the weights alone
        detect_format(sd)
        sd, cfg, guesses = read_timm_hub(hub_cfg, sd, path)
        return cfg, sd, "timm", guesses
    if detect_format(sd) != "hf":
        raise CheckpointError(
            f"{path}: the weights next to config.json are timm weights, but config.json has no 'architecture' "
            "(timm Hub folders have one); add it, or load the weights file itself"
        )
    projected = has_clip_projection(sd)  # read before hf_to_timm makes it the head
    sd = hf_to_timm(sd)
    pre_file = path / "preprocessor_config.json"
    pre = _read_json(pre_file) if pre_file.exists() else None
    cfg, guesses = hf_config_to_vit(hub_cfg, pre, sd, projected=projected)
    return cfg, sd, "hf", guesses


# transformers' weight files in the order it reads them: safetensors, then torch's (save_pretrained(safe_serialization=False));
# either whole or in shards named by "<file>.index.json"
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def _read_dir_weights(path: Path) -> StateDict:
    sd: StateDict = {}
    for file in _dir_weights(path)[0]:
        sd.update(_read_tensors(file)[0])
    return sd


def _dir_weights(path: Path) -> tuple[list[Path], Path | None]:
    """(the weights files of the model folder `path` that are read, the shard index naming them or None)."""
    for name in _HF_WEIGHTS:
        if (path / name).exists():
            return [path / name], None
        index = path / f"{name}.index.json"
        if index.exists():
            return _shard_files(path, index), index
    raise CheckpointError(f"{path} has config.json but no model.safetensors or pytorch_model.bin (whole or sharded)")


def folder_files(path: str | os.PathLike) -> list[Path]:
    """The files loading the model folder `path` reads, sorted: config.json, preprocessor_config.json where there is one,
    the weights (whole, or a shard index and its shards); a README or another format's weights beside them are not read."""
    path = Path(path)
    weights, index = _dir_weights(path)
    extra = [f for f in (path / "config.json", path / "preprocessor_config.json", index) if f is not None and f.is_file()]
    return sorted([*extra, *weights])


def _shard_files(folder: Path, index_file: Path) -> list[Path]:
    """The shard files an index (model.safetensors.index.json, pytorch_model.bin.index.json) names: plain file names inside
    `folder`, never a path like ../../x that would read files elsewhere."""
    weight_map = _read_json(index_file).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_file} has no valid weight_map (tensor name -> shard file)")
    shards = sorted(set(weight_map.values()))
    bad = [s for s in shards if Path(s).name != s or s in ("", ".", "..")]
    if bad:
        raise CheckpointError(f"{index_file} names shard files outside the model folder ({bad[0]!r}); "
                              "a shard must be a file name in the folder: fix or re-download the index")  # fmt: skip
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise CheckpointError(f"{folder} lacks shard {missing[0]} named in {index_file.name}; re-download the model")
    return [folder / s for s in shards]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _read_tensors(path: Path) -> tuple[StateDict, dict[str, str]]:
    """Tensors and safetensors metadata; the container is sniffed, not guessed from the suffix."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 8:
        raise CheckpointError(f"{path} is empty or truncated ({len(head)} bytes); re-download or re-save it")
    if not _is_safetensors_head(head) and (head[:4] == b"PK\x03\x04" or head[:1] == b"\x80"):  # torch zip or legacy pickle
        return _torch_load(path), {}
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        if path.suffix.lower() in IMAGE_SUFFIXES:  # `vitfast predict photo.png model.onnx`: the arguments swapped
            raise CheckpointError(f"{path} is an image, not a model checkpoint (`vitfast predict` takes the model first, "
                                  "then the images)") from None  # fmt: skip
        raise CheckpointError(
            f"{path} is not a readable checkpoint (neither safetensors nor a torch file: {first_line(exc)}); "
            "it may be truncated or corrupt: re-download or re-save it"
        ) from None


def _is_safetensors_head(head: bytes) -> bool:
    """safetensors: an 8-byte little-endian header length, then the JSON header's '{'. The length's
    first byte alone can be 0x80 (one header size in 256), which is also how a legacy pickle starts,
    so the '{' decides."""
    return len(head) >= 9 and head[8:9] == b"{"


def _check_declared_sizes(path: Path) -> None:
    """A torch zip archive whose records claim more bytes than the file holds (compressed records:
    torch never writes them) would be inflated in memory before any check: refuse it unread."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a readable zip: torch.load reports it as corrupt
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > size:
            raise CheckpointError(f"{path}: record {info.filename} is compressed ({info.file_size} bytes unpacked, the file has "
                                  f"{size}); torch never writes that, so it is refused unread: re-save the checkpoint")  # fmt: skip


def _torch_load(path: Path) -> StateDict:
    _check_declared_sizes(path)
    try:
        # timm's train.py saves its argparse Namespace beside the weights: plain attributes, nothing run to rebuild it
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip(path))
    except Exception as exc:  # torch raises many types for bad archives; all mean the same here
        msg = first_line(exc)
        if "Weights only load failed" in str(exc):
            raise CheckpointError(
                f"refusing to load {path}: it contains pickled objects other than tensors, and vitfast never "
                "executes pickled code; re-save just the state dict (or safetensors) from a trusted environment"
            ) from None
        raise CheckpointError(f"{path} is truncated or corrupt ({msg}); re-download or re-save it") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")
    return obj


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _unwrap(obj: dict[str, Any], use_ema: bool = True) -> tuple[StateDict, str | None]:
    """(the weights, a note when they were chosen over others). Training checkpoints nest the weights ('model',
    'state_dict', ...) and DDP prefixes 'module.'. timm's hold the weights' EMA beside them ('state_dict_ema', or
    'model_ema'), which timm's load_checkpoint(use_ema=True) prefers, as `timm.create_model(checkpoint_path=...)` loads
    it: so does vitfast, unless `use_ema=False`."""
    nested = [k for k in ("model", "state_dict", "model_state_dict") if isinstance(obj.get(k), dict)]
    ema = next((k for k in ("state_dict_ema", "model_ema") if isinstance(obj.get(k), dict)), None)
    key = ema if ema and (use_ema or not nested) else nested[0] if nested else None
    note = None
    if key == ema and nested:  # a choice between two sets of weights, made for the caller
        note = (f"this training checkpoint holds '{nested[0]}' and its EMA '{ema}'; the EMA loaded, as timm's "
                f"load_checkpoint(use_ema=True) does: `export --no-ema` or load_checkpoint(use_ema=False) takes '{nested[0]}'")  # fmt: skip
    elif key == ema and not use_ema:
        note = f"use_ema=False, but this training checkpoint holds only its EMA weights '{ema}': those loaded"
    sd = {k: v for k, v in (obj[key] if key else obj).items() if isinstance(v, torch.Tensor)}
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd, note


# ---------------------------------------------------------------------------- fitting
def _stored_grid(pos: torch.Tensor, src: ViTConfig, dst: ViTConfig) -> tuple[int, int] | None:
    """The patch grid a checkpoint's position embeddings [1, T, C] are laid out on (None: no grid fits T)."""
    n_grid = pos.shape[1] - (0 if dst.no_embed_class else dst.num_prefix_tokens)
    if src.pos_grid[0] * src.pos_grid[1] == n_grid:
        return src.pos_grid
    if n_grid > 0 and math.isqrt(n_grid) ** 2 == n_grid:
        return (math.isqrt(n_grid),) * 2
    return None


def _fit_pos_embed(pos: torch.Tensor, src: ViTConfig, dst: ViTConfig, *, antialias: bool) -> torch.Tensor:
    """Resample position embeddings when the target's stored patch grid differs from the source's."""
    old_grid = _stored_grid(pos, src, dst)
    if old_grid is None:
        return pos  # does not fit at all: _check_keys reports the shape mismatch
    if old_grid == dst.pos_grid:
        return pos
    prefix = 0 if dst.no_embed_class else dst.num_prefix_tokens
    return resample_pos_embed(pos, dst.pos_grid, num_prefix_tokens=prefix, old_grid=old_grid, antialias=antialias)


def _keep_hf_pos_embed(cfg: ViTConfig, pos: torch.Tensor, src: ViTConfig, antialias: bool, stated: dict[str, Any]) -> ViTConfig:
    """A dynamic_img_size model of a Hugging Face checkpoint resizes the stored table in every forward, by transformers'
    rule, as `interpolate_pos_encoding` does (timm's resizes once at load to img_size, then from there)."""
    grid = _stored_grid(pos, src, cfg)
    keep = {"pos_embed_antialias": antialias} | ({"pos_embed_grid": grid if grid != cfg.grid_size else None} if grid else {})
    return cfg.replace(**{k: v for k, v in keep.items() if k not in stated})


def _check_keys(sd: StateDict, expected: StateDict, path: Path, cfg: ViTConfig, *, given: bool,
                overridden: tuple[ViTConfig, ViTConfig] | None) -> None:  # fmt: skip
    """Refuse weights that do not fit the model, listing every key that does not, and saying what would help: another
    config only where the caller `given` one (config=), or `overridden` the checkpoint's (the configs before and after
    overrides=) with one of other shapes, or where the shapes contradict the checkpoint's own."""
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    mismatched = [
        f"{k} (checkpoint {list(sd[k].shape)} vs model {list(expected[k].shape)})"
        for k in expected
        if k in sd and sd[k].shape != expected[k].shape
    ]
    if not (missing or unexpected or mismatched):
        return
    given = given or (overridden is not None and _shapes(overridden[0]) != _shapes(overridden[1]))
    parts = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
        if keys:
            shown = ", ".join(keys[:MAX_LISTED]) + (f", ... ({len(keys) - MAX_LISTED} more)" if len(keys) > MAX_LISTED else "")
            parts.append(f"{len(keys)} {label}: {shown}")
    # a config given may be the wrong one; the file's own gaps and extras no config fixes
    advice = ["if the config given is not this checkpoint's, pass its own, or none to have vitfast read it from the checkpoint"] if given else []
    advice += ["a checkpoint without the missing weights is truncated or partial: re-download or re-save it"] if missing else []
    advice += ["the unexpected weights have no place in vitfast's ViT (a part it does not implement, or another model's beside the "
               "ViT's): save the state dict without them if they are not used at inference"] if unexpected else []
    advice += ["its shapes contradict the config it states: pass the right one with config= (--config FILE.json)"] if mismatched and not given else []
    name = cfg.name or f"embed_dim={cfg.embed_dim}, depth={cfg.depth}, num_classes={cfg.num_classes}"
    raise CheckpointError(f"{path} does not fit the model ({name}): " + "; ".join(parts) + ". "
                          + " ".join(f"{a[0].upper()}{a[1:]}." for a in advice))
