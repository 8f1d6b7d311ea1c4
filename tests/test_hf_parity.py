"""Parity against Hugging Face `transformers`: random HF models saved with `save_pretrained`,
loaded by vitfast, logits compared in fp32."""

from __future__ import annotations

import json
import warnings

import pytest
import safetensors.torch
import torch

import vitfast

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e .[test])")

ATOL = 1e-5


def _hf_vit(**kw):
    cfg = transformers.ViTConfig(**kw)
    model = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():  # HF inits LayerNorm to (1, 0) and biases to 0: perturb them all
        for name, p in model.named_parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


HF_CONFIGS = {
    "base-like": dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                      intermediate_size=256, num_labels=10, qkv_bias=True),
    "no-qkv-bias-tanh": dict(image_size=48, patch_size=16, hidden_size=96, num_hidden_layers=2, num_attention_heads=3,
                             intermediate_size=200, num_labels=5, qkv_bias=False, hidden_act="gelu_pytorch_tanh",
                             layer_norm_eps=1e-6),
    "patch4-2ch": dict(image_size=24, patch_size=4, num_channels=2, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=3),
}  # fmt: skip


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_hf_directory_logits_match(tmp_path, name):
    hf = _hf_vit(**HF_CONFIGS[name])
    hf.save_pretrained(tmp_path)
    model = vitfast.load_checkpoint(tmp_path)
    c = hf.config
    assert model.config.embed_dim == c.hidden_size and model.config.num_heads == c.num_attention_heads
    assert model.config.qkv_bias == c.qkv_bias and model.config.norm_eps == c.layer_norm_eps
    x = torch.randn(3, c.num_channels, c.image_size, c.image_size)
    with torch.no_grad():
        expected = hf(pixel_values=x).logits
        got = model(x)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_hf_sharded_directory_loads_as_transformers_loads_it(tmp_path, weights):
    """save_pretrained(max_shard_size=...) writes model-0000N-of-0000M.safetensors shards behind model.safetensors.index.json;
    transformers before 5 wrote torch's .bin shards behind pytorch_model.bin.index.json (safe_serialization=False), which
    from_pretrained still reads. Made here from transformers' own shards, checked with from_pretrained, then read by vitfast."""
    hf = _hf_vit(**HF_CONFIGS["base-like"])
    hf.save_pretrained(tmp_path, max_shard_size="50KB")
    if weights == "bin":
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        shards = {f: f.replace("model-", "pytorch_model-").replace(".safetensors", ".bin") for f in set(index["weight_map"].values())}
        for shard, renamed in shards.items():
            torch.save(safetensors.torch.load_file(tmp_path / shard), tmp_path / renamed)
            (tmp_path / shard).unlink()
        (tmp_path / "model.safetensors.index.json").unlink()
        weight_map = {k: shards[f] for k, f in index["weight_map"].items()}
        (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index | {"weight_map": weight_map}))
    assert len(list(tmp_path.glob(f"*-of-*.{weights}"))) > 1
    reference = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    model = vitfast.load_checkpoint(tmp_path)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(pixel_values=x).logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, atol=ATOL, rtol=0)


def test_hf_state_dict_alone_loads(tmp_path):
    """A bare HF state dict (transformers 5 in-memory names, no config.json): the config is read
    off the shapes with HF's eps 1e-12; the head count cannot be, so it warns and takes config=."""
    hf = _hf_vit(**HF_CONFIGS["base-like"])
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.warns(UserWarning, match="num_heads cannot be read"):
        guessed = vitfast.load_checkpoint(tmp_path / "pytorch_model.bin")
    assert guessed.config.norm_eps == 1e-12 and guessed.config.num_classes == 10
    model = vitfast.load_checkpoint(tmp_path / "pytorch_model.bin", config=guessed.config.replace(num_heads=4))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, atol=ATOL, rtol=0)


def test_hf_higher_resolution_matches_interpolate_pos_encoding(tmp_path):
    hf = _hf_vit(**HF_CONFIGS["base-like"])
    hf.save_pretrained(tmp_path)
    model = vitfast.load_checkpoint(tmp_path, img_size=56)
    assert model.pos_embed.shape[1] == 1 + 7 * 7
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        expected = hf(pixel_values=x, interpolate_pos_encoding=True).logits
        got = model(x)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_hf_deit_distilled_matches(tmp_path):
    cfg = transformers.DeiTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128, num_labels=6)  # fmt: skip
    hf = transformers.DeiTForImageClassificationWithTeacher(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.02 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    model = vitfast.load_checkpoint(tmp_path)
    assert model.config.distilled
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, atol=ATOL, rtol=0)


def test_hf_deit_classifier_without_teacher_reads_the_class_token_alone(tmp_path):
    """DeiTForImageClassification has a distillation token but one classifier, on the class token: from the folder, the
    weights alone (its shapes say so) and vitfast's own checkpoint, vitfast gives its logits."""
    cfg = transformers.DeiTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, num_labels=6)  # fmt: skip
    hf = _perturbed(transformers.DeiTForImageClassification(cfg))
    hf.save_pretrained(tmp_path / "hf")
    torch.save(hf.state_dict(), tmp_path / "weights.bin")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vitfast.GuessedConfigWarning)  # no preprocessor_config.json
        model = vitfast.load_checkpoint(tmp_path / "hf")
        alone = vitfast.load_checkpoint(tmp_path / "weights.bin", overrides={"num_heads": 4})
        vitfast.save_checkpoint(model, tmp_path / "vitfast.safetensors")
        saved = vitfast.load_checkpoint(tmp_path / "vitfast.safetensors")
    assert (model.config.distilled, model.config.dist_head, alone.config.dist_head, saved.config.dist_head) == (True, False, False, False)
    assert not hasattr(model, "head_dist")
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = hf(pixel_values=x).logits
        for loaded in (model, alone, saved):
            torch.testing.assert_close(loaded(x), expected, atol=ATOL, rtol=0)


def test_hf_preprocessor_config_is_read(tmp_path):
    hf = _hf_vit(**HF_CONFIGS["base-like"])
    hf.save_pretrained(tmp_path)
    processor = transformers.ViTImageProcessor(image_mean=[0.1, 0.2, 0.3], image_std=[0.4, 0.5, 0.6], size=32)
    processor.save_pretrained(tmp_path)
    cfg = vitfast.load_checkpoint(tmp_path).config
    assert cfg.mean == (0.1, 0.2, 0.3) and cfg.std == (0.4, 0.5, 0.6)
    assert cfg.interpolation == "bilinear" and cfg.crop_pct == 1.0


# ---------------------------------------------------------------------------- bare ViTModel / DeiTModel: the pooler
@pytest.mark.parametrize("pooler_output_size", [None, 40], ids=["pooler-hidden", "pooler-40"])
def test_hf_vit_model_returns_pooler_output(tmp_path, pooler_output_size):
    """A bare ViTModel (google/vit-*-in21k): its pooler, tanh(dense(normalised class token)), is the ViT paper's
    pre-logits layer; vitfast loads it as one and returns pooler_output, from the folder and from the weights alone,
    and again after its own save."""
    kw = HF_CONFIGS["base-like"] | ({"pooler_output_size": pooler_output_size} if pooler_output_size else {})
    hf = _perturbed(transformers.ViTModel(transformers.ViTConfig(**kw)))
    hf.save_pretrained(tmp_path / "hf")
    x = torch.randn(3, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vitfast.GuessedConfigWarning)  # no preprocessor_config.json
        model = vitfast.load_checkpoint(tmp_path / "hf")
    assert (model.config.num_classes, model.config.representation_size) == (0, pooler_output_size or 64)
    vitfast.save_checkpoint(model, tmp_path / "vitfast.safetensors")
    torch.save(hf.state_dict(), tmp_path / "weights.bin")
    alone = vitfast.load_checkpoint(tmp_path / "weights.bin", config=model.config)
    with torch.no_grad():
        expected = hf(pixel_values=x).pooler_output
        for loaded in (model, vitfast.load_checkpoint(tmp_path / "vitfast.safetensors"), alone):
            torch.testing.assert_close(loaded(x), expected, atol=ATOL, rtol=0)


def test_hf_vit_model_with_a_pooler_activation_other_than_tanh_is_refused_by_name(tmp_path):
    _perturbed(transformers.ViTModel(transformers.ViTConfig(**HF_CONFIGS["base-like"], pooler_act="relu"))).save_pretrained(tmp_path)
    with pytest.raises(vitfast.CheckpointError, match="pooler_act='relu'.*add_pooling_layer=False"):
        vitfast.load_checkpoint(tmp_path)


def test_hf_classifier_never_reads_a_pooler_in_its_weights(tmp_path):
    """ViTForImageClassification classifies the normalised class token; pooler weights saved beside it (a
    ViTModel's, merged by hand) are not put between the two."""
    hf = _hf_vit(**HF_CONFIGS["base-like"])
    hf.save_pretrained(tmp_path)
    pooler = _perturbed(transformers.ViTModel(hf.config)).pooler.state_dict()
    sd = safetensors.torch.load_file(tmp_path / "model.safetensors") | {f"vit.pooler.{k}": v for k, v in pooler.items()}
    safetensors.torch.save_file(sd, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = vitfast.load_checkpoint(tmp_path)
    assert model.config.representation_size is None
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, atol=ATOL, rtol=0)


def test_hf_deit_model_returns_its_two_tokens_mean_and_says_its_pooler_is_not_loaded(tmp_path):
    """DeiTModel's pooler_output is tanh(dense(class token)) beside a distillation token, which vitfast's distilled
    models do not compute: the pooler is dropped, the output is the mean of the two normalised tokens, and it says so."""
    cfg = transformers.DeiTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128)  # fmt: skip
    hf = _perturbed(transformers.DeiTModel(cfg))
    hf.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="DeiTModel returns pooler_output = tanh"):
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.distilled and model.config.representation_size is None
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = hf(pixel_values=x).last_hidden_state
        torch.testing.assert_close(model(x), tokens[:, :2].mean(1), atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------- CLIP image tower
CLIP_VISION = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=160, projection_dim=24)  # fmt: skip


def _perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("hidden_act", ["quick_gelu", "gelu"])
def test_hf_clip_vision_with_projection_matches_image_embeds(tmp_path, hidden_act):
    """CLIPVisionModelWithProjection + CLIPImageProcessor folder: the model returns image_embeds,
    the config says all (nothing guessed), the preprocessing is the processor's."""
    hf = _perturbed(transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**CLIP_VISION, hidden_act=hidden_act)))
    hf.save_pretrained(tmp_path)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.pre_norm, c.act_layer, c.norm_eps, c.num_classes) == (True, {"quick_gelu": "quick_gelu", "gelu": "gelu"}[hidden_act], 1e-5, 24)
    assert (c.mean, c.crop_mode, c.interpolation) == (vitfast.config.OPENAI_CLIP_MEAN, "center", "bicubic")
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).image_embeds, atol=ATOL, rtol=0)


def test_hf_clip_full_model_folder_loads_its_image_tower(tmp_path):
    """A whole CLIPModel (text tower, logit_scale): the image tower's embedding, nothing else, and
    the preprocessing guessed as CLIPImageProcessor's defaults when the folder has no processor."""
    cfg = transformers.CLIPConfig(vision_config=CLIP_VISION, projection_dim=24,
                                  text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))  # fmt: skip
    hf = _perturbed(transformers.CLIPModel(cfg))
    hf.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="CLIPImageProcessor defaults assumed"):
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.std == vitfast.config.OPENAI_CLIP_STD and model.config.crop_pct == 1.0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = hf.visual_projection(hf.vision_model(pixel_values=x).pooler_output)
        torch.testing.assert_close(model(x), expected, atol=ATOL, rtol=0)


def test_hf_clip_vision_model_without_projection_returns_pooler_output(tmp_path):
    hf = _perturbed(transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**CLIP_VISION)))
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")  # a bare state dict: transformers' CLIP defaults
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"mean=.*crop_pct=1.0.*act_layer='quick_gelu', norm_eps=1e-05.*transformers' CLIP default"):
        guessed = vitfast.load_checkpoint(tmp_path / "pytorch_model.bin")
    assert guessed.config.num_classes == 0 and guessed.config.pre_norm
    model = vitfast.load_checkpoint(tmp_path / "pytorch_model.bin", overrides={"num_heads": 4})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).pooler_output, atol=ATOL, rtol=0)


def test_hf_clip_higher_resolution_matches_interpolate_pos_encoding(tmp_path):
    hf = _perturbed(transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**CLIP_VISION)))
    hf.save_pretrained(tmp_path)
    model = vitfast.load_checkpoint(tmp_path, img_size=48)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        expected = hf(pixel_values=x, interpolate_pos_encoding=True).image_embeds
        torch.testing.assert_close(model(x), expected, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------- DINOv2
DINOV2 = dict(image_size=28, patch_size=7, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=3,
              layerscale_value=0.5)  # fmt: skip


def _hf_dinov2(registers: int, *, classifier: bool = False, **kw):
    """A random transformers DINOv2 (with `registers` register tokens if > 0): the backbone, or its
    ImageClassification head; `kw` on top of DINOV2's config fields."""
    fields = DINOV2 | kw
    if registers:
        cls = transformers.Dinov2WithRegistersForImageClassification if classifier else transformers.Dinov2WithRegistersModel
        return cls(transformers.Dinov2WithRegistersConfig(**fields, num_register_tokens=registers))
    cls = transformers.Dinov2ForImageClassification if classifier else transformers.Dinov2Model
    return cls(transformers.Dinov2Config(**fields))


@pytest.mark.parametrize("registers", [0, 4])
def test_hf_dinov2_backbone_matches_pooler_output(tmp_path, registers):
    """Dinov2Model and Dinov2WithRegistersModel folders: layer scale, registers (their position
    embedding folded as timm does), the pooled class token == transformers' pooler_output."""
    hf = _hf_dinov2(registers)
    _perturbed(hf).save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="BitImageProcessor defaults assumed"):
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.reg_tokens, c.no_embed_class, c.num_classes, c.patch_size, c.norm_eps) == (registers, registers > 0, 0, 7, 1e-6)
    assert c.mean == vitfast.config.IMAGENET_MEAN
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).pooler_output, atol=ATOL, rtol=0)
        torch.save(hf.state_dict(), tmp_path / "bare.bin")  # without config.json: read off the shapes
    bare = vitfast.load_checkpoint(tmp_path / "bare.bin", overrides={"num_heads": 4})
    assert bare.config.norm_eps == 1e-6 and bare.config.reg_tokens == registers
    assert bare.config.no_embed_class == (registers > 0) and "no_embed_class" not in bare.config_guesses  # converted so: a fact
    with torch.no_grad():
        torch.testing.assert_close(bare(x), hf(pixel_values=x).pooler_output, atol=ATOL, rtol=0)


@pytest.mark.parametrize("registers", [0, 4])
def test_hf_dinov2_classifier_reads_class_and_mean_patch_token(tmp_path, registers):
    """Dinov2ForImageClassification (the facebook/dinov2-*-imagenet1k-1-layer heads): a Linear over the
    class token and the mean of the patch tokens side by side (registers excluded), global_pool
    "token_avg"; as a folder with its labels and as a bare state dict."""
    labels = {0: "cat", 1: "dog", 2: "eel"}
    hf = _hf_dinov2(registers, classifier=True, id2label=labels)
    _perturbed(hf).save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="BitImageProcessor defaults assumed"):
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.global_pool, c.num_features, c.labels, c.reg_tokens) == ("token_avg", 128, ("cat", "dog", "eel"), registers)
    x = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        expected = hf(pixel_values=x).logits
        torch.testing.assert_close(model(x), expected, atol=ATOL, rtol=0)
        torch.save(hf.state_dict(), tmp_path / "bare.bin")
    with pytest.warns(UserWarning, match="num_heads cannot be read"):
        bare = vitfast.load_checkpoint(tmp_path / "bare.bin")
    assert (bare.config.global_pool, bare.config.num_heads) == ("token_avg", 1)  # 64 wide: head_dim 64 assumed
    bare = vitfast.load_checkpoint(tmp_path / "bare.bin", overrides={"num_heads": 4})
    with torch.no_grad():
        torch.testing.assert_close(bare(x), expected, atol=ATOL, rtol=0)


def test_hf_dinov2_classifier_of_another_width_is_refused_by_name(tmp_path):
    hf = transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**DINOV2, num_labels=3))
    sd = hf.state_dict()
    sd["classifier.weight"] = torch.zeros(3, 3 * 64)  # neither the class token nor class + mean patch token
    hf.save_pretrained(tmp_path / "cls", state_dict=sd)
    with pytest.raises(vitfast.CheckpointError, match="reads 192 features"):
        vitfast.load_checkpoint(tmp_path / "cls")


@pytest.mark.parametrize("registers", [0, 4])
def test_hf_dinov2_giant_swiglu_mlp(tmp_path, registers):
    """use_swiglu_ffn (facebook/dinov2-giant): SiLU-gated MLP whatever hidden_act says, 2/3 of mlp_ratio's
    width rounded up to 8, as a classifier. Folders hold fc1 packed (`weights_in`, gate then value);
    transformers from 5.2x splits it in memory (`gate_proj`, `up_proj`), earlier ones keep it packed:
    bare state dicts in both layouts load."""
    # SwiGLU width (int(256 * 2/3) + 7) // 8 * 8 = 176
    hf = _hf_dinov2(registers, classifier=True, use_swiglu_ffn=True, mlp_ratio=4, num_labels=3)
    _perturbed(hf).save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="BitImageProcessor defaults assumed"):
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.mlp_layer, c.act_layer, c.mlp_hidden, c.global_pool) == ("swiglu_packed", "silu", 2 * 176, "token_avg")
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        expected = hf(pixel_values=x).logits
        torch.testing.assert_close(model(x), expected, atol=ATOL, rtol=0)
    sd, packed, split = hf.state_dict(), {}, {}  # this transformers' state dict, in both layouts
    for key, value in sd.items():
        if ".mlp.weights_in." in key:
            gate, up = value.chunk(2)
            split |= {key.replace("weights_in", "gate_proj"): gate, key.replace("weights_in", "up_proj"): up}
            packed[key] = value
        elif ".mlp.gate_proj." in key:
            packed[key.replace("gate_proj", "weights_in")] = torch.cat([value, sd[key.replace("gate_proj", "up_proj")]])
            split[key] = value
        elif ".mlp.up_proj." in key:
            split[key] = value
        else:
            packed[key] = split[key] = value
    for layout, sd in (("packed", packed), ("split", split)):
        torch.save(sd, tmp_path / f"{layout}.bin")
        bare = vitfast.load_checkpoint(tmp_path / f"{layout}.bin", overrides={"num_heads": 4})
        assert (bare.config.mlp_layer, bare.config.act_layer) == ("swiglu_packed", "silu"), layout
        with torch.no_grad():
            torch.testing.assert_close(bare(x), expected, atol=ATOL, rtol=0, msg=layout)


@pytest.mark.parametrize("registers", [0, 4])
def test_hf_dinov2_runs_at_its_processors_size_as_transformers_does(tmp_path, registers):
    """DINOv2 ships image_size 518 with a processor cropping 224 and interpolates its position
    embeddings at run time: vitfast takes the processor's size (nothing guessed) and resizes them
    once at load, the way transformers does on every forward."""
    hf = _hf_dinov2(registers)
    _perturbed(hf).save_pretrained(tmp_path)
    transformers.BitImageProcessor(size={"shortest_edge": 24}, crop_size={"height": 35, "width": 35}).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.img_size == 35 and model.config.grid_size == (5, 5)
    x = torch.randn(2, 3, 35, 35)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).pooler_output, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------- SigLIP image tower
SIGLIP_VISION = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=160)
SIGLIP_TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=99)


def test_hf_siglip_vision_model_matches_its_attention_pool_output(tmp_path):
    """SiglipVisionModel + SiglipImageProcessor folder: the attention-pool head (`pooler_output`),
    the tanh GELU, a squashing bicubic resize; nothing guessed."""
    hf = _perturbed(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP_VISION)))
    hf.save_pretrained(tmp_path)
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.global_pool, c.class_token, c.act_layer, c.norm_eps, c.num_classes) == ("map", False, "gelu_tanh", 1e-6, 0)
    assert (c.mean, c.crop_mode, c.crop_pct, c.interpolation) == ((0.5,) * 3, "squash", 1.0, "bicubic")
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).pooler_output, atol=ATOL, rtol=0)


def test_hf_siglip_full_model_folder_loads_its_image_tower(tmp_path):
    """A whole SiglipModel (text tower, logit scale and bias): the image features; without a processor
    config the preprocessing is SiglipImageProcessor's defaults, said loudly."""
    hf = _perturbed(transformers.SiglipModel(transformers.SiglipConfig(vision_config=SIGLIP_VISION, text_config=SIGLIP_TEXT)))
    hf.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="SiglipImageProcessor defaults assumed"):
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.crop_mode == "squash" and model.config.std == (0.5,) * 3
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf.vision_model(pixel_values=x).pooler_output, atol=ATOL, rtol=0)


def test_hf_siglip_image_classifier_pools_by_the_mean_token(tmp_path):
    """SiglipForImageClassification classifies the mean of the normalised tokens (its tower's
    attention pool is unused): global_pool="avg" without fc_norm, the labels from config.json."""
    labels = {0: "cat", 1: "dog", 2: "eel"}
    cfg = transformers.SiglipConfig(vision_config=SIGLIP_VISION, text_config=SIGLIP_TEXT, id2label=labels,
                                    label2id={v: k for k, v in labels.items()})  # fmt: skip
    hf = _perturbed(transformers.SiglipForImageClassification(cfg))
    hf.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="SiglipImageProcessor"):
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.global_pool, c.use_fc_norm, c.num_classes, c.labels) == ("avg", False, 3, ("cat", "dog", "eel"))
    assert not any(k.startswith("attn_pool.") for k in model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, atol=ATOL, rtol=0)


def test_hf_siglip_tower_without_a_head_pools_by_the_mean_and_says_so(tmp_path):
    """vision_use_head=False (PaliGemma's encoders): transformers returns no pooled output; vitfast
    returns the mean token, as timm's *_siglip_gap_* models do, and reports that choice."""
    hf = _perturbed(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP_VISION, vision_use_head=False)))
    hf.save_pretrained(tmp_path)
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="global_pool='avg'.*no pooled output"):
        model = vitfast.load_checkpoint(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "bare.bin")
    with pytest.warns(vitfast.GuessedConfigWarning, match="global_pool='avg'.*no pooled output"):
        bare = vitfast.load_checkpoint(tmp_path / "bare.bin", overrides={"num_heads": 4})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = hf(pixel_values=x).last_hidden_state.mean(1)
        torch.testing.assert_close(model(x), expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(bare(x), expected, atol=ATOL, rtol=0)


def test_hf_siglip_bare_state_dict_takes_transformers_defaults(tmp_path):
    hf = _perturbed(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP_VISION)))
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.warns(vitfast.GuessedConfigWarning, match="transformers' SIGLIP default") as caught:
        guessed = vitfast.load_checkpoint(tmp_path / "pytorch_model.bin")
    assert "crop_mode='squash'" in str(caught[0].message) and "act_layer='gelu_tanh'" in str(caught[0].message)
    assert (guessed.config.global_pool, guessed.config.norm_eps) == ("map", 1e-6)
    model = vitfast.load_checkpoint(tmp_path / "pytorch_model.bin", overrides={"num_heads": 4})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).pooler_output, atol=ATOL, rtol=0)


@pytest.mark.parametrize("image_size, img_size", [(32, 48), (36, 36)])
def test_hf_siglip_other_sizes_match_transformers(tmp_path, image_size, img_size):
    """At a new size, position embeddings resized as `interpolate_pos_encoding` does; and at a size
    that is not a multiple of the patch (so400m/14 at 384), the trailing pixels ignored as HF does."""
    hf = _perturbed(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP_VISION | dict(image_size=image_size))))
    hf.save_pretrained(tmp_path)
    transformers.SiglipImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(tmp_path)
    model = vitfast.load_checkpoint(tmp_path, img_size=img_size)
    assert model.config.grid_size == (img_size // 8,) * 2
    x = torch.randn(2, 3, img_size, img_size)
    with torch.no_grad():
        expected = hf(pixel_values=x, interpolate_pos_encoding=img_size != image_size).pooler_output
        torch.testing.assert_close(model(x), expected, atol=ATOL, rtol=0)


def test_hf_siglip2_naflex_tower_is_refused_by_name(tmp_path):
    cfg = transformers.Siglip2VisionConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=96, patch_size=8)
    transformers.Siglip2VisionModel(cfg).save_pretrained(tmp_path)
    with pytest.raises(vitfast.CheckpointError, match="SigLIP 2 NaFlex"):
        vitfast.load_checkpoint(tmp_path)


SMALL_VIT = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)


@pytest.mark.parametrize("layout", ["as saved", "hub"])
def test_hf_vit_msn_classifier_matches(tmp_path, layout):
    """ViT-MSN (`facebook/vit-msn-*`): ViT's layers under model_type "vit_msn", LayerNorm eps 1e-6 by default.
    The hub's files keep the layers under `vit.`; transformers 5's save_pretrained writes them without it."""
    from safetensors.torch import load_file, save_file

    hf = _perturbed(transformers.ViTMSNForImageClassification(transformers.ViTMSNConfig(**SMALL_VIT, num_labels=5)))
    hf.save_pretrained(tmp_path)
    if layout == "hub":
        saved = load_file(tmp_path / "model.safetensors")
        save_file({f"vit.{k}" if k.startswith("encoder.") else k: v for k, v in saved.items()}, tmp_path / "model.safetensors")
    with pytest.warns(vitfast.GuessedConfigWarning, match="ViTImageProcessor defaults"):  # no preprocessor_config.json here
        model = vitfast.load_checkpoint(tmp_path)
    assert (model.config.global_pool, model.config.norm_eps, model.config.num_classes) == ("token", 1e-6, 5)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, atol=ATOL, rtol=0)


def test_hf_ijepa_classifier_reads_the_mean_token(tmp_path):
    """I-JEPA (`facebook/ijepa_*`): no class token, position embeddings on the patches only; the classifier
    reads the mean of the normalised tokens."""
    labels = {0: "cat", 1: "dog", 2: "eel"}
    cfg = transformers.IJepaConfig(**SMALL_VIT, id2label=labels, label2id={v: k for k, v in labels.items()})
    hf = _perturbed(transformers.IJepaForImageClassification(cfg))
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vitfast.GuessedConfigWarning)  # preprocessing: no preprocessor_config.json
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.class_token, c.global_pool, c.use_fc_norm, c.norm_eps, c.labels) == (False, "avg", False, 1e-12, ("cat", "dog", "eel"))
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("pooler", [False, True])
def test_hf_ijepa_backbone_returns_the_mean_token_and_says_so(tmp_path, pooler):
    """A bare IJepaModel returns the mean token; one saved with a pooler (transformers' pooler_output reads the first patch
    token) still does, and the warning says its pooler is not loaded."""
    hf = _perturbed(transformers.IJepaModel(transformers.IJepaConfig(**SMALL_VIT), add_pooling_layer=pooler))
    hf.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="global_pool='avg' \\(I-JEPA has no class token.*add_pooling_layer=True.*"
                      "a pooler vitfast does not load"):  # fmt: skip
        model = vitfast.load_checkpoint(tmp_path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = hf(pixel_values=x)
        torch.testing.assert_close(model(x), out.last_hidden_state.mean(1), atol=ATOL, rtol=0)
    assert (out.pooler_output is not None) == pooler


# ---------------------------------------------------------------------------- AIMv2 image tower
AIMV2_VISION = dict(image_size=28, patch_size=14, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=176,
                    use_head=False)  # fmt: skip


def _hf_aimv2(**kw):
    """A random Aimv2VisionModel (RMSNorm weights off one, biases off zero); `kw` on top of AIMV2_VISION."""
    return _perturbed(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**AIMV2_VISION | kw)))


@pytest.mark.parametrize("bias", [False, True])
def test_hf_aimv2_vision_model_matches_its_tokens_and_pools_by_their_mean(tmp_path, bias):
    """Aimv2VisionModel without its head (apple/aimv2-*-patch14-224 ...) + CLIPImageProcessor folder: RMSNorm (also on
    the patch tokens), SwiGLU with gate and value apart, biases on every Linear or none; the tokens are
    last_hidden_state, the pooled output their mean (transformers returns none: said, as the only guess)."""
    hf = _hf_aimv2(qkv_bias=bias, mlp_bias=bias)
    hf.save_pretrained(tmp_path)
    transformers.CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="global_pool='avg' .*no pooled output"):
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert set(model.config_guesses) == {"global_pool"}
    assert (c.norm_layer, c.embed_norm, c.mlp_layer, c.act_layer, c.mlp_hidden, c.norm_eps) == ("rmsnorm", True, "swiglu", "silu", 176, 1e-5)
    assert (c.class_token, c.global_pool, c.use_fc_norm, c.num_classes, c.qkv_bias, c.proj_bias) == (False, "avg", False, 0, bias, bias)
    assert (c.mean, c.crop_mode, c.interpolation) == (vitfast.config.OPENAI_CLIP_MEAN, "center", "bicubic")
    x = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        tokens = hf(pixel_values=x).last_hidden_state
        torch.testing.assert_close(model.forward_features(x), tokens, atol=ATOL, rtol=0)
        torch.testing.assert_close(model(x), tokens.mean(1), atol=ATOL, rtol=0)


def test_hf_aimv2_bare_state_dict_reads_its_shapes_and_takes_transformers_defaults(tmp_path):
    hf = _hf_aimv2()
    hf.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "bare.bin")
    with pytest.warns(vitfast.GuessedConfigWarning, match="transformers' AIMV2 default") as caught:
        guessed = vitfast.load_checkpoint(tmp_path / "bare.bin")
    message = str(caught[0].message)
    assert "act_layer='silu'" in message and "norm_eps=1e-05" in message and "crop_mode='center'" in message
    assert {"num_heads", "global_pool", "mean", "interpolation"} <= set(guessed.config_guesses)
    with pytest.warns(vitfast.GuessedConfigWarning):
        folder = vitfast.load_checkpoint(tmp_path).config
    with pytest.warns(vitfast.GuessedConfigWarning, match="transformers' AIMV2 default"):
        bare = vitfast.load_checkpoint(tmp_path / "bare.bin", overrides={"num_heads": 4})
    assert bare.config == folder  # architecture and CLIPImageProcessor's defaults sized for the model alike
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(bare(x), hf(pixel_values=x).last_hidden_state.mean(1), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "kw, named, in_weights",
    [
        (dict(use_head=True), r"attention-pooling head \(use_head=True.*does not implement.*tokens \(last_hidden_state\) would match", True),
        (dict(is_native=True), r"native-resolution AIMv2 tower \(is_native=True", True),
        (dict(qkv_bias=True, mlp_bias=False), "qkv_bias=True .*but mlp_bias=False", True),
        (dict(qkv_bias=False, mlp_bias=True), "qkv_bias=False .*but mlp_bias=True", True),
        (dict(hidden_act="gelu"), "gates its MLP with hidden_act 'gelu'", False),
    ],
)
def test_hf_aimv2_towers_vitfast_cannot_compute_are_refused_by_name(tmp_path, kw, named, in_weights):
    """The attention-pooling head (not timm's attention pool: no query projection), sinusoidal positions
    computed at any size, attention and MLP biases that differ, a gate other than SiLU: refused, from the
    folder and, where the weights show it, from a bare state dict; never loaded with a part dropped."""
    hf = _hf_aimv2(**kw)
    hf.save_pretrained(tmp_path)
    with pytest.raises(vitfast.CheckpointError, match=named):
        vitfast.load_checkpoint(tmp_path)
    if in_weights:
        torch.save(hf.state_dict(), tmp_path / "bare.bin")
        with pytest.raises(vitfast.CheckpointError, match=named):
            vitfast.load_checkpoint(tmp_path / "bare.bin")


def test_hf_aimv2_tower_with_its_head_stripped_loads_its_tokens(tmp_path):
    """What the refusal of a tower with a head says: saved without it (use_head=False, no head.*), its tokens match."""
    hf = _hf_aimv2(use_head=True)
    hf.config.use_head = False
    hf.save_pretrained(tmp_path, state_dict={k: v for k, v in hf.state_dict().items() if not k.startswith("head.")})
    with pytest.warns(vitfast.GuessedConfigWarning, match="global_pool='avg'"):
        model = vitfast.load_checkpoint(tmp_path)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), hf(pixel_values=x).last_hidden_state, atol=ATOL, rtol=0)


@pytest.mark.parametrize("use_head", [True, False])
def test_hf_aimv2_model_is_refused_its_image_embeds_project_the_head(tmp_path, use_head):
    """Aimv2Model's image_embeds are visual_projection(pooler_output): the head's output, which vitfast does not
    compute (without a head transformers fails); so it is refused, not loaded as a CLIP-like projection of the mean."""
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=99, eos_token_id=98)
    cfg = transformers.Aimv2Config(vision_config=AIMV2_VISION | dict(use_head=use_head), text_config=text, projection_dim=24)
    transformers.Aimv2Model(cfg).save_pretrained(tmp_path)
    with pytest.raises(vitfast.CheckpointError, match="Aimv2Model .*attention-pooling head"):
        vitfast.load_checkpoint(tmp_path)


# ---------------------------------------------------------------------------- unpooled: every token out
@pytest.mark.parametrize("kind", ["vit-classifier", "vit-model", "dinov2", "dinov2-registers", "siglip", "siglip-headless", "ijepa", "aimv2"])
def test_unpooled_tokens_match_last_hidden_state(tmp_path, kind):
    """global_pool="" (with num_classes=0 for a classifier) returns transformers' last_hidden_state: every
    token after the final norm; a classifier's head, a ViTModel's pooler and SigLIP's attention pool are dropped, and the towers
    whose pooled output vitfast had to choose (the mean token) give their tokens as they are."""
    towers = {
        "vit-model": lambda: transformers.ViTModel(transformers.ViTConfig(**HF_CONFIGS["base-like"])),  # its pooler is dropped too
        "siglip": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP_VISION)),
        "siglip-headless": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP_VISION, vision_use_head=False)),
        "ijepa": lambda: transformers.IJepaModel(transformers.IJepaConfig(**SMALL_VIT)),
        "aimv2": lambda: transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**AIMV2_VISION)),
        "dinov2": lambda: _hf_dinov2(0),
        "dinov2-registers": lambda: _hf_dinov2(4),
    }  # fmt: skip
    hf = _hf_vit(**HF_CONFIGS["base-like"]) if kind == "vit-classifier" else _perturbed(towers[kind]())
    size = hf.config.image_size
    x = torch.randn(2, 3, size, size)
    tokens = lambda: (hf.vit if kind == "vit-classifier" else hf)(pixel_values=x).last_hidden_state  # noqa: E731
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vitfast.GuessedConfigWarning)  # the preprocessing, not what is compared
        model = vitfast.load_checkpoint(tmp_path, overrides={"num_classes": 0, "global_pool": ""})
    with torch.no_grad():
        expected = tokens()
        torch.testing.assert_close(model(x), expected, atol=ATOL, rtol=0)
    assert model.config.output_shape == expected.shape[1:]


def test_transformers_aimv2_vision_defaults_are_the_installed_ones():
    from vitfast.convert import AIMV2_DEFAULTS

    defaults = transformers.Aimv2VisionConfig()
    assert {k: getattr(defaults, k) for k in AIMV2_DEFAULTS} == AIMV2_DEFAULTS


DINOV3 = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=176,
              num_register_tokens=4, layerscale_value=0.5)  # fmt: skip
# a DINOv3ViTImageProcessorFast preprocessor_config.json in the facebook/dinov3-* form, sized for DINOV3
DINOV3_PROCESSOR = dict(image_processor_type="DINOv3ViTImageProcessorFast", do_resize=True, size={"height": 32, "width": 32}, resample=2,
                        do_rescale=True, rescale_factor=1 / 255, do_normalize=True, image_mean=[0.485, 0.456, 0.406],
                        image_std=[0.229, 0.224, 0.225], do_center_crop=None, crop_size=None)  # fmt: skip


def _hf_dinov3(**kw):
    """A random DINOv3ViTModel (norms and layer scales off their init); `kw` on top of DINOV3."""
    return _perturbed(transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**DINOV3 | kw)))


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # ViT-S/B/L/16: GELU MLP, q and v biases, no key bias
        dict(use_gated_mlp=True, hidden_act="silu", rope_theta=37.0),  # ViT-S+/H+/7B: SwiGLU with gate and up apart
        dict(query_bias=False, value_bias=False, proj_bias=False, mlp_bias=False, num_register_tokens=0),
        dict(key_bias=True, image_size=40, layer_norm_eps=1e-6),
    ],
    ids=["gelu", "swiglu", "no-biases-no-registers", "key-bias"],
)
def test_hf_dinov3_matches_its_tokens_and_pooled_class_token(tmp_path, kw):
    """DINOv3ViTModel folder (facebook/dinov3-*-pretrain-*): 2-D rotary positions on the patch tokens only (class
    and register tokens unrotated), layer scale, q/k/v fused with the missing key bias as zeros; the tokens are
    last_hidden_state, the pooled output the normalised class token (pooler_output). Nothing is guessed."""
    hf = _hf_dinov3(**kw)
    hf.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(DINOV3_PROCESSOR | dict(size={"height": 32, "width": 32})))
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    assert (c.rope, c.abs_pos_embed, c.rope_theta, c.reg_tokens, c.init_values) == ("dinov3", False, kw.get("rope_theta", 100.0),
                                                                                    kw.get("num_register_tokens", 4), 0.5)  # fmt: skip
    assert (c.mlp_layer, c.global_pool, c.num_classes, c.img_size) == ("swiglu" if "use_gated_mlp" in kw else "mlp", "token", 0, 32)
    assert (c.mean, c.std, c.crop_mode, c.interpolation) == (vitfast.config.IMAGENET_MEAN, vitfast.config.IMAGENET_STD, "squash", "bilinear")
    assert model.pos_embed is None and not any("pos_embed" in k for k in model.state_dict())
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        out = hf(pixel_values=x)
        torch.testing.assert_close(model.forward_features(x), out.last_hidden_state, atol=ATOL, rtol=0)
        torch.testing.assert_close(model(x), out.pooler_output, atol=ATOL, rtol=0)


def test_hf_dinov3_in_memory_names_and_backbone_load_alike(tmp_path):
    """transformers 5 holds the layers as `model.layer.N` in memory (`layer.N` on disk); DINOv3ViTBackbone has the same
    weights. Both load, to the same outputs."""
    hf = _hf_dinov3()
    hf.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="no preprocessor_config.json; DINOv3ViTImageProcessor defaults"):
        folder = vitfast.load_checkpoint(tmp_path)
    assert any(k.startswith("model.layer.0.") for k in hf.state_dict())
    torch.save(hf.state_dict(), tmp_path / "memory.bin")
    with pytest.warns(vitfast.GuessedConfigWarning):
        memory = vitfast.load_checkpoint(tmp_path / "memory.bin", overrides={"num_heads": 4, "img_size": 32})
    backbone = transformers.DINOv3ViTBackbone(hf.config).eval()
    backbone.load_state_dict(hf.state_dict())
    torch.save(backbone.state_dict(), tmp_path / "backbone.bin")
    with pytest.warns(vitfast.GuessedConfigWarning):
        from_backbone = vitfast.load_checkpoint(tmp_path / "backbone.bin", overrides={"num_heads": 4, "img_size": 32})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for model in (memory, from_backbone):
            torch.testing.assert_close(model(x), folder(x), atol=0, rtol=0)


def test_hf_dinov3_bare_state_dict_reads_its_shapes_and_says_what_it_assumed(tmp_path):
    hf = _hf_dinov3(use_gated_mlp=True, hidden_act="silu")
    with pytest.warns(vitfast.GuessedConfigWarning, match="transformers' DINOv3") as caught:
        model = vitfast.load_checkpoint(_saved(hf.state_dict(), tmp_path / "bare.safetensors"))
    assert {"num_heads", "norm_eps", "rope_theta", "img_size", "mean", "interpolation"} <= set(model.config_guesses)
    assert "head_dim 64 assumed" in str(caught[0].message)  # no registered DINOv3 has this width
    c = model.config
    assert (c.num_heads, c.img_size, c.norm_eps, c.rope_theta, c.mlp_layer, c.reg_tokens) == (1, 224, 1e-5, 100.0, "swiglu", 4)
    with pytest.warns(vitfast.GuessedConfigWarning):
        model = vitfast.load_checkpoint(tmp_path / "bare.safetensors", overrides={"num_heads": 4, "img_size": 32})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).pooler_output, atol=ATOL, rtol=0)


def _saved(sd, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


@pytest.mark.parametrize(
    "kw, named",
    [
        (dict(proj_bias=True, mlp_bias=False), "proj_bias=True but mlp_bias=False"),
        (dict(use_gated_mlp=True, hidden_act="gelu"), "gates its MLP with hidden_act 'gelu'"),
        (dict(hidden_act="gelu_pytorch_tanh"), "MLP uses hidden_act 'gelu_pytorch_tanh'"),
    ],
)
def test_hf_dinov3_models_vitfast_cannot_compute_are_refused_by_name(tmp_path, kw, named):
    _hf_dinov3(**kw).save_pretrained(tmp_path)
    with pytest.raises(vitfast.CheckpointError, match=named):
        vitfast.load_checkpoint(tmp_path)


def test_hf_dinov3_preprocessing_is_its_processors_within_one_level(tmp_path):
    """DINOv3ViTImageProcessor (torchvision only) rescales to float, resizes straight to its size (bilinear, antialiased)
    and normalises with ImageNet's mean/std. vitfast resizes the 8-bit image with Pillow's bilinear filter: written out
    here with torch's antialiased bilinear (what torchvision's tensor resize calls), the two differ by at most about one
    level of 255 per pixel, a third of one on average."""
    from PIL import Image

    hf = _hf_dinov3()
    hf.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(DINOV3_PROCESSOR | dict(size={"height": 48, "width": 48})))
    cfg = vitfast.load_checkpoint(tmp_path).config
    assert cfg.img_size == 48  # rotary positions are computed for whatever size the processor makes
    mean, std = torch.tensor(cfg.mean)[:, None, None], torch.tensor(cfg.std)[:, None, None]
    for h, w in [(97, 131), (300, 120), (48, 48), (40, 33)]:
        image = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8)
        ours = vitfast.preprocess(Image.fromarray(image.numpy()), cfg)[0]
        resized = torch.nn.functional.interpolate(image.permute(2, 0, 1)[None].float() / 255, size=(48, 48), mode="bilinear",
                                                  antialias=True, align_corners=False)[0]  # fmt: skip
        levels = ((ours - (resized - mean) / std) * std * 255).abs()
        assert levels.max() <= 1.1 and levels.mean() <= 0.4, (h, w, levels.max(), levels.mean())


def test_transformers_dinov3_defaults_are_the_installed_ones():
    from vitfast.dinov3 import DEFAULTS

    defaults = transformers.DINOv3ViTConfig()
    assert {k: getattr(defaults, k) for k in DEFAULTS} == DEFAULTS


BACKBONES = {
    "dinov2": (transformers.Dinov2Backbone, transformers.Dinov2Config, DINOV2),
    "dinov2-registers": (transformers.Dinov2WithRegistersBackbone, transformers.Dinov2WithRegistersConfig, DINOV2 | dict(num_register_tokens=4)),
    "dinov3": (transformers.DINOv3ViTBackbone, transformers.DINOv3ViTConfig, DINOV3),
}


@pytest.mark.parametrize(
    "kind, kw, fmt",
    [("dinov2", dict(out_indices=[1, 3]), "NCHW"), ("dinov2", dict(apply_layernorm=False), "NCHW"),  # default: the last stage
     ("dinov2-registers", dict(out_features=["stage2", "stage4"]), "NCHW"), ("dinov3", dict(out_indices=[2, 4]), "NCHW"),
     ("dinov3", dict(out_indices=[1, 3], reshape_hidden_states=False, apply_layernorm=False), "NLC"),
     ("dinov2", dict(out_indices=[2, 4], reshape_hidden_states=False), "NLC"),  # Depth Anything's: every token, normalised
     ("dinov2-registers", dict(out_indices=[1, 3], reshape_hidden_states=False), "NLC")],
    ids=["dinov2", "dinov2-default-stage-no-norm", "dinov2-registers", "dinov3", "dinov3-tokens-no-norm", "dinov2-every-token",
         "dinov2-registers-every-token"],
)  # fmt: skip
def test_hf_backbone_folder_returns_its_feature_maps(tmp_path, kind, kw, fmt):
    """A *Backbone folder (AutoBackbone: DPT / Depth Anything / Mask2Former encoders) loads as features_only and returns
    transformers' `feature_maps`, stacked: the stages out_indices name (stage i = after block i - 1), normalised with
    apply_layernorm, NCHW with reshape_hidden_states; without it DINOv2's every token (class and registers first), DINOv3's
    patch tokens. Unused blocks are not built."""
    backbone_cls, config_cls, fields = BACKBONES[kind]
    hf = _perturbed(backbone_cls(config_cls(**fields | dict(num_hidden_layers=4) | kw)))
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vitfast.GuessedConfigWarning)  # the processor's defaults: not what this test is about
        model = vitfast.load_checkpoint(tmp_path)
    c = model.config
    stages = hf.out_indices
    assert (c.features_only, c.feature_indices, c.output_fmt, c.feature_norm) == (True, tuple(i - 1 for i in stages), fmt,
                                                                                   kw.get("apply_layernorm", True))  # fmt: skip
    assert c.feature_prefix_tokens == (fmt == "NLC" and kind != "dinov3")
    assert len(model.blocks) == stages[-1]
    x = torch.randn(2, 3, fields["image_size"], fields["image_size"])
    with torch.no_grad():
        torch.testing.assert_close(model(x), torch.stack(hf(pixel_values=x).feature_maps, dim=1), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "kind, kw, named",
    [("dinov2", dict(out_features=["stem", "stage2"]), "returns the stem"),
     ("dinov3", dict(apply_layernorm=False), "normalises its last stage anyway")],
)  # fmt: skip
def test_hf_backbone_feature_maps_vitfast_cannot_compute_are_refused_by_name(tmp_path, kind, kw, named):
    backbone_cls, config_cls, fields = BACKBONES[kind]
    backbone_cls(config_cls(**fields | kw)).save_pretrained(tmp_path)
    with pytest.raises(vitfast.CheckpointError, match=named):
        vitfast.load_checkpoint(tmp_path)


def test_hf_backbone_with_stage_names_transformers_would_not_write_is_refused(tmp_path):
    transformers.Dinov2Backbone(transformers.Dinov2Config(**DINOV2)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "out_indices"} | {"out_features": ["layer2"]}))
    with pytest.raises(vitfast.CheckpointError, match=r"out_features \['layer2'\] are not transformers' stage names"):
        vitfast.load_checkpoint(tmp_path)


def test_hf_unknown_model_type_lists_what_loads(tmp_path):
    hf = _hf_vit(**HF_CONFIGS["base-like"])
    hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict() | {"model_type": "swin"}))
    with pytest.raises(vitfast.CheckpointError, match="'swin' model; vitfast reads .*DINOv3.*AIMv2 .*'dinov3_vit'"):
        vitfast.load_checkpoint(tmp_path)
