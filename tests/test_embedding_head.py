"""A head that projects into an image embedding (CLIP's image_embeds) is no classifier (`ViTConfig.embedding_head`): info
says so, predict writes the embeddings whole and ranks nothing, eval refuses, a Triton repository attaches no labels, check
reports no top-1 agreement. Set for Hugging Face CLIP's visual_projection, for timm's CLIP towers under their image-text
tags, and for the registered towers whose default tag is one; a new head (another num_classes) is a classifier.
Reference: a random transformers CLIPVisionModelWithProjection / CLIPModel saved with `save_pretrained`, in fp32."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers", reason="the reference is a transformers CLIP image tower and its processor")

import vitfast  # noqa: E402
from vitfast.config import ViTConfig  # noqa: E402
from vitfast.convert import infer_timm_config, timm_hub_config  # noqa: E402
from vitfast.errors import ArtifactError, ConfigError  # noqa: E402
from vitfast.model import VisionTransformer  # noqa: E402
from vitfast.registry import get_config  # noqa: E402

from test_foreign_onnx import run  # noqa: E402
from test_image_loading import write_images  # noqa: E402

VISION = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              projection_dim=16)  # fmt: skip
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def _processor():
    return transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """(folder of a saved CLIPVisionModelWithProjection with its processor, the model, an images folder)."""
    root = tmp_path_factory.mktemp("clip")
    torch.manual_seed(0)
    model = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**VISION)).eval()
    model.save_pretrained(root / "clip")
    _processor().save_pretrained(root / "clip")
    write_images(root / "images" / "a", 3, seed=1)
    write_images(root / "images" / "b", 2, seed=2)
    return root / "clip", model, root / "images"


def _image_embeds(model, files):
    with torch.no_grad():
        return model(**_processor()([Image.open(f).convert("RGB") for f in files], return_tensors="pt")).image_embeds.numpy()


def test_hf_clip_projection_is_an_image_embedding(clip, tmp_path):
    folder, hf, _ = clip
    cfg = vitfast.load_checkpoint(folder).config
    assert cfg.embedding_head and cfg.num_classes == 16 and not cfg.classifies and cfg.labels is None
    whole = tmp_path / "whole"  # a whole CLIPModel too, its text tower dropped
    torch.manual_seed(1)
    transformers.CLIPModel(transformers.CLIPConfig(vision_config=VISION, text_config=TEXT, projection_dim=16)).eval().save_pretrained(whole)
    _processor().save_pretrained(whole)
    assert vitfast.load_checkpoint(whole).config.embedding_head
    torch.save(hf.state_dict(), tmp_path / "bare.bin")  # a bare state dict: the projection's name says it, nothing guessed about it
    with pytest.warns(vitfast.GuessedConfigWarning) as caught:
        bare = vitfast.load_checkpoint(tmp_path / "bare.bin")
    assert bare.config.embedding_head and "embedding_head" not in bare.config_guesses and "embedding_head" not in str(caught[0].message)
    # without the projection (num_classes=0) the pooled features, no longer an embedding head; labels are refused with it
    assert not vitfast.load_checkpoint(folder, overrides={"num_classes": 0}).config.embedding_head
    with pytest.raises(ConfigError, match="image embedding"):
        vitfast.load_checkpoint(folder, overrides={"labels": [str(i) for i in range(16)]})


def test_info_and_predict_treat_it_as_an_embedding(clip, tmp_path):
    folder, hf, images = clip
    info = json.loads(run("info", folder, "--json").stdout)["output"]
    assert info["is"].startswith("image embedding (CLIP's image_embeds") and info["embedding_dim"] == 16
    assert "scores" not in info and not info.get("classes")
    refused = run("predict", folder, images)
    assert refused.returncode == 2 and "returns image embeddings [16] per image, not classes: give --out FILE.npz" in refused.stderr
    refused = run("predict", folder, images, "--out", tmp_path / "e.jsonl", "--top-k", 3)
    assert refused.returncode == 2 and "--top-k / --scores do not apply" in refused.stderr and not (tmp_path / "e.jsonl").exists()
    done = run("predict", folder, images, "--out", tmp_path / "e.npz", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "image embeddings [16]"
    saved = np.load(tmp_path / "e.npz")
    files = sorted((images / "a").iterdir()) + sorted((images / "b").iterdir())
    assert list(saved["files"]) == [str(f) for f in files]
    assert np.abs(saved["outputs"] - _image_embeds(hf, files)).max() < 1e-4  # the numbers are transformers' image_embeds
    assert run("predict", folder, images / "a", "--out", tmp_path / "e.jsonl").returncode == 0
    rows = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert np.abs(np.array([r["output"] for r in rows]) - saved["outputs"][:3]).max() < 1e-6


def test_export_check_eval_and_triton_repository_of_an_embedding(clip, tmp_path):
    pytest.importorskip("onnxruntime", reason="the artifact here is an ONNX export: pip install 'vitfast[onnx]'")
    folder, hf, images = clip
    onnx = tmp_path / "clip.onnx"
    done = run("export", "--checkpoint", folder, "--format", "onnx", "--out", onnx)
    assert done.returncode == 0, done.stderr
    assert "top-1 agreement" not in done.stderr  # the argmax of an embedding is no prediction
    meta = json.loads(onnx.with_name("clip.onnx.json").read_text())
    assert ViTConfig.from_dict(meta["config"]).embedding_head  # the sidecar carries it: every runtime reads it back
    assert json.loads(run("info", onnx, "--json").stdout)["output"]["is"].startswith("image embedding")
    check = run("check", onnx)
    assert check.returncode == 0 and "PASSED" in check.stdout and "top-1 agreement" not in check.stdout
    assert json.loads(run("check", onnx, "--json").stdout)["classifies"] is False
    refused = run("eval", onnx, "--data", images)
    assert refused.returncode != 0 and "an embedding model has no classes" in refused.stderr
    from vitfast.export.triton_repo import triton_repository

    repo = triton_repository(onnx, tmp_path / "repo")
    texts = {p.relative_to(repo).as_posix(): p.read_text() for p in repo.rglob("*.pbtxt")}
    assert texts and not any("label_filename" in t for t in texts.values()) and not list(repo.rglob("labels.txt"))
    # an export whose sidecar predates the field reads as a classifier, and takes it as an override like labels
    engine = vitfast.runtime.load_engine(onnx, overrides={"embedding_head": False})
    assert engine.config.classifies
    assert vitfast.runtime.load_engine(onnx).config.embedding_head


def test_eval_refuses_an_embedding_checkpoint(clip):
    from vitfast import pipeline
    from vitfast.runtime import load_engine

    folder, _, images = clip
    with pytest.raises(ArtifactError, match="an embedding model has no classes"):
        pipeline.evaluate(load_engine(folder), images)


def test_registry_clip_towers_and_a_new_head():
    embed = get_config("vit_base_patch32_clip_quickgelu_224")
    assert embed.embedding_head and embed.num_classes == 512 and not embed.classifies
    for name in ("vit_xsmall_patch16_clip_224", "vit_huge_patch14_clip_378", "eva02_base_patch16_clip_224", "vit_pe_core_base_patch16_224"):
        assert get_config(name).embedding_head, name
    # their default tags are ImageNet fine-tunes: classifiers
    for name in ("vit_base_patch32_clip_224", "vit_large_patch14_clip_336", "eva02_base_patch14_448"):
        assert get_config(name).classifies and not get_config(name).embedding_head, name
    # fine-tuning: another num_classes is a new head, a classifier; 0 drops the projection (pooled features)
    tuned = get_config("vit_base_patch32_clip_quickgelu_224", num_classes=10)
    assert tuned.classifies and not tuned.embedding_head
    small = vitfast.create_model("vit_xsmall_patch16_clip_224", num_classes=10, img_size=32, depth=1)
    assert small.config.classifies and small(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert not get_config("vit_base_patch32_clip_quickgelu_224", num_classes=0).embedding_head
    assert get_config("vit_base_patch32_clip_quickgelu_224", img_size=256).embedding_head  # what keeps the head keeps its meaning
    assert not get_config("vit_base_patch32_clip_quickgelu_224", embedding_head=False).embedding_head  # a 512-class classifier, said
    with pytest.raises(ConfigError, match="image embedding"):
        get_config("vit_base_patch32_clip_quickgelu_224", problem_type="single_label_classification")
    with pytest.raises(ConfigError, match="no head"):
        ViTConfig(num_classes=0, embedding_head=True)
    assert not ViTConfig.from_dict({k: v for k, v in embed.to_dict().items() if k != "embedding_head"}).embedding_head  # old sidecars


def test_get_config_follows_an_image_text_tag():
    assert not get_config("vit_base_patch16_clip_224").embedding_head  # its default tag is a fine-tune
    openai = get_config("vit_base_patch16_clip_224.openai")
    assert (openai.num_classes, openai.embedding_head, openai.name) == (512, True, "vit_base_patch16_clip_224")
    assert get_config("vit_large_patch14_clip_336.laion2b").num_classes == 768
    assert not get_config("vit_base_patch16_clip_224.laion2b_ft_in1k").embedding_head
    assert get_config("vit_base_patch16_clip_224.openai", num_classes=10).num_classes == 10  # said wins over the tag
    with pytest.raises(ConfigError, match="fine-tuned classifier.*num_classes="):
        get_config("vit_base_patch16_clip_quickgelu_224.openai_ft_in1k")
    tuned = get_config("vit_base_patch16_clip_quickgelu_224.openai_ft_in1k", num_classes=1000)
    assert tuned.classifies and not tuned.embedding_head
    assert get_config("vit_small_patch16_224.augreg_in21k") == get_config("vit_small_patch16_224")  # no image-text tower


def _hub(arch: str, num_classes: int, tag: str | None, **model_args) -> tuple[dict, dict]:
    pc = {"input_size": [3, 32, 32], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0, **({"tag": tag} if tag else {})}
    cfg = {"architecture": arch, "num_classes": num_classes, "model_args": model_args, "pretrained_cfg": pc,
           "label_names": [f"c{i}" for i in range(num_classes)]}  # fmt: skip
    with torch.device("meta"):
        sd = VisionTransformer(get_config(arch, **model_args, num_classes=num_classes)).state_dict()
    return cfg, sd


@pytest.mark.parametrize("arch, num_classes, tag, embedding", [
    ("vit_base_patch32_clip_224", 512, "openai", True),  # an image-text tag of a tower whose default is a fine-tune
    ("vit_base_patch32_clip_224", 1000, "laion2b_ft_in12k_in1k", False),
    ("vit_base_patch16_clip_224", 11821, "openai_ft_in12k", False),
    ("vit_base_patch32_clip_quickgelu_224", 512, "metaclip_400m", True),
    ("vit_base_patch32_clip_224", 512, None, True),  # no tag: as wide as the projection
    ("vit_base_patch32_clip_224", 1000, None, False),
    ("vit_base_patch16_224", 512, "augreg_in21k", False),  # no image-text tower
])  # fmt: skip
def test_timm_hub_folder_heads_follow_their_tag(arch, num_classes, tag, embedding):
    cfg, sd = _hub(arch, num_classes, tag, img_size=32, depth=1)
    config, _ = timm_hub_config(cfg, sd)
    assert (config.num_classes, config.embedding_head, config.classifies) == (num_classes, embedding, not embedding)
    assert (config.labels is None) == embedding  # label_names of an embedding's dimensions are dropped


def test_bare_timm_clip_tower_head_is_guessed_an_embedding():
    with torch.device("meta"):
        sd = VisionTransformer(get_config("vit_base_patch32_clip_quickgelu_224")).state_dict()
        tuned = VisionTransformer(get_config("vit_base_patch32_clip_quickgelu_224", num_classes=1000)).state_dict()
    config, guesses = infer_timm_config(sd)
    assert config.embedding_head and "image projection" in guesses["embedding_head"]
    config, guesses = infer_timm_config(tuned)
    assert config.classifies and "embedding_head" not in guesses
