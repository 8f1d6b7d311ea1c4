"""Preprocessing of Hugging Face checkpoints against `transformers`' own image processors (the PIL
backend, what `ViTImageProcessor` is without torchvision): the `ViTConfig` read from
`preprocessor_config.json` must make `vitfast.preprocess`, the numpy Triton port and the engine's
uint8 path give the processor's pixels, on non-square, tiny and huge images, PIL and uint8 arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitfast
from vitfast.convert import PROCESSOR_DEFAULTS
from vitfast.export.triton_preprocess import PreprocessSpec, preprocess_batch

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e .[test])")


def processor_class(name: str):
    """transformers 5 names the PIL backend `<name>Pil`; in 4.x `<name>` is the PIL one."""
    return getattr(transformers, f"{name}Pil", None) or getattr(transformers, name)


def class_defaults_from_source(kind: str):
    """The class attributes a processor class sets, read from the installed transformers' source without importing
    it (its module imports torchvision); IMAGENET_DEFAULT_* and PILImageResampling.* resolved from transformers."""
    import ast
    import importlib.util

    from transformers import image_utils

    model = {"DINOv3ViTImageProcessor": "dinov3_vit"}[kind]
    path = importlib.util.find_spec(f"transformers.models.{model}").submodule_search_locations[0] + f"/image_processing_{model}.py"
    cls = next(n for n in ast.walk(ast.parse(open(path).read())) if isinstance(n, ast.ClassDef) and n.name == kind)
    names = {"IMAGENET_DEFAULT_MEAN": list(image_utils.IMAGENET_DEFAULT_MEAN), "IMAGENET_DEFAULT_STD": list(image_utils.IMAGENET_DEFAULT_STD)}
    values = {}
    for node in cls.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Attribute) and ast.unparse(value.value) == "PILImageResampling":
                values[node.targets[0].id] = int(getattr(image_utils.PILImageResampling, value.attr))
            elif isinstance(value, ast.Name):
                values[node.targets[0].id] = names.get(value.id, value.id)
            else:
                values[node.targets[0].id] = ast.literal_eval(value)
    return type(kind, (), values)


# (processor class, its arguments, the model's image_size)
PROCESSORS = {
    "vit-default": ("ViTImageProcessor", {}, 224),  # straight to 224x224, no crop, mean/std 0.5, bilinear
    "vit-custom": ("ViTImageProcessor", dict(size={"height": 32, "width": 32}, image_mean=[0.1, 0.2, 0.3],
                                             image_std=[0.4, 0.5, 0.6], resample=3), 32),
    "deit": ("DeiTImageProcessor", dict(size={"height": 40, "width": 40}, crop_size={"height": 32, "width": 32}), 32),
    "clip-shortest-edge": ("CLIPImageProcessor", dict(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}), 32),
    "siglip": ("SiglipImageProcessor", dict(size={"height": 48, "width": 48}), 48),  # straight to 48x48, bicubic, 0.5
    "bit": ("BitImageProcessor", dict(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}), 32),  # DINOv2's
    "convnext-crop-pct": ("ConvNextImageProcessor", dict(size={"shortest_edge": 32}, crop_pct=0.875, resample=2), 32),
    "convnext-384-warps": ("ConvNextImageProcessor", dict(size={"shortest_edge": 384}), 384),
    "rescale-folded": ("ViTImageProcessor", dict(size={"height": 32, "width": 32}, rescale_factor=1 / 127.5,
                                                 image_mean=[1.0, 1.0, 1.0], image_std=[1.0, 1.0, 1.0]), 32),
}  # fmt: skip

# (height, width): non-square both ways, odd margins (floored vs rounded crop offsets), tiny, huge
SIZES = [(480, 640), (640, 480), (97, 131), (3, 5), (1, 1), (1500, 2000), (224, 224)]


def _hf_folder(tmp_path, key: str):
    cls, kwargs, img_size = PROCESSORS[key]
    processor = processor_class(cls)(**kwargs)
    hf_cfg = transformers.ViTConfig(image_size=img_size, patch_size=16 if img_size >= 224 else 8, hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=3)  # fmt: skip
    model = transformers.ViTForImageClassification(hf_cfg).eval()
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    return processor, model


def _images(seed: int):
    rng = np.random.default_rng(seed)
    for h, w in SIZES:
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        arr[: h // 2] = (np.arange(w)[None, :, None] * 7 + np.arange(h // 2)[:, None, None] * 3) % 256  # smooth part
        yield f"{h}x{w}", arr


@pytest.mark.parametrize("key", list(PROCESSORS))
def test_preprocess_matches_the_hf_processor(tmp_path, key):
    processor, _ = _hf_folder(tmp_path, key)
    config = vitfast.load_checkpoint(tmp_path).config
    for name, arr in _images(0):
        expected = processor(Image.fromarray(arr), return_tensors="pt")["pixel_values"]
        for image in (Image.fromarray(arr), arr):  # PIL and uint8 arrays alike
            torch.testing.assert_close(vitfast.preprocess(image, config), expected, atol=2e-6, rtol=0, msg=f"{key} {name}")
        spec = PreprocessSpec.from_config(config)
        np.testing.assert_allclose(preprocess_batch(arr[None], spec), expected.numpy(), atol=2e-6, rtol=0, err_msg=f"{key} {name}")


def test_vit_processor_resizes_straight_without_crop(tmp_path):
    """The issue's case: a 640x480 photo, ViTImageProcessor squashes it; the engine's uint8 path gives HF's logits."""
    processor, hf = _hf_folder(tmp_path, "vit-default")
    engine = vitfast.load_engine(tmp_path, device="cpu")
    assert (engine.config.crop_mode, engine.config.crop_pct) == ("squash", 1.0)
    arr = np.random.default_rng(1).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    with torch.no_grad():
        expected = hf(pixel_values=processor(Image.fromarray(arr), return_tensors="pt")["pixel_values"]).logits
    torch.testing.assert_close(engine(arr[None]), expected, atol=1e-5, rtol=0)


def test_missing_preprocessor_config_is_a_loud_guess(tmp_path):
    processor, hf = _hf_folder(tmp_path, "vit-custom")
    (tmp_path / "preprocessor_config.json").unlink()
    with pytest.warns(vitfast.GuessedConfigWarning, match="no preprocessor_config.json") as record:
        model = vitfast.load_checkpoint(tmp_path)
    assert "mean" in model.config_guesses and "img_size" not in model.config_guesses, record[0].message
    assert (model.config.crop_mode, model.config.interpolation, model.config.mean) == ("squash", "bilinear", (0.5,) * 3)


def test_id2label_becomes_the_labels(tmp_path):
    hf_cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, id2label={0: "cat", 1: "dog", 2: "emu"})  # fmt: skip
    transformers.ViTForImageClassification(hf_cfg).save_pretrained(tmp_path)
    processor_class("ViTImageProcessor")(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    assert vitfast.load_checkpoint(tmp_path).config.labels == ("cat", "dog", "emu")
    _hf_folder(tmp_path, "vit-custom")  # transformers' placeholders LABEL_0.. are not labels
    assert vitfast.load_checkpoint(tmp_path).config.labels is None


@pytest.mark.parametrize("named", ["feature_extractor_type", "nothing"])
def test_legacy_clip_preprocessor_config_keeps_the_aspect_ratio(tmp_path, named):
    """openai/clip-vit-* ship a feature-extractor-era preprocessor_config.json: integer `size` and
    `crop_size` and `feature_extractor_type: CLIPFeatureExtractor` (no image_processor_type).
    transformers reads that as CLIPImageProcessor, whose integer size is the shortest edge; so must
    vitfast (a square resize would squash every non-square photo), also when no type is named."""
    import json

    vision = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**vision)).save_pretrained(tmp_path)
    legacy = {"crop_size": 32, "do_center_crop": True, "do_normalize": True, "do_resize": True, "resample": 3, "size": 40,
              "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip
    if named == "feature_extractor_type":
        legacy["feature_extractor_type"] = "CLIPFeatureExtractor"
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(legacy))
    config = vitfast.load_checkpoint(tmp_path).config
    assert (config.crop_mode, config.img_hw) == ("center", (32, 32))
    processor = processor_class("CLIPImageProcessor")(**{k: v for k, v in legacy.items() if k != "feature_extractor_type"})
    for name, arr in _images(2):
        expected = processor(Image.fromarray(arr), return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(vitfast.preprocess(arr, config), expected, atol=2e-6, rtol=0, msg=name)


@pytest.mark.parametrize("kind", sorted(PROCESSOR_DEFAULTS))
def test_processor_class_defaults_are_transformers(kind):
    """What vitfast assumes for a key a preprocessor_config.json leaves out is the processor class's
    own default in the installed transformers."""
    try:
        processor = processor_class(kind)()
    except ImportError:  # DINOv3's processor is torchvision-only, and make test's venv has no torchvision
        processor = class_defaults_from_source(kind)
    expected = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "do_center_crop": None, "crop_size": None, "crop_pct": None}
    ours = expected | PROCESSOR_DEFAULTS[kind]
    for key, value in ours.items():
        got = getattr(processor, key, None)
        if hasattr(got, "items") or hasattr(got, "__dataclass_fields__"):  # SizeDict: compare the fields it sets
            got = {k: v for k, v in dict(got.items() if hasattr(got, "items") else vars(got)).items() if v is not None}
        elif isinstance(got, tuple):
            got = list(got)
        assert got == value or (value is None and got in (None, False)), (kind, key, got)


def test_keys_left_out_of_a_preprocessor_config_take_the_class_defaults(tmp_path):
    """A CLIP folder whose preprocessor_config.json gives only the sizes: centre crop, bicubic and
    OpenAI's mean/std are CLIPImageProcessor's defaults, as transformers applies them."""
    import json

    vision = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**vision)).save_pretrained(tmp_path)
    sizes = {"size": {"shortest_edge": 40}, "crop_size": {"height": 32, "width": 32}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "CLIPImageProcessor", **sizes}))
    config = vitfast.load_checkpoint(tmp_path).config
    processor = processor_class("CLIPImageProcessor")(**sizes)
    for name, arr in _images(3):
        expected = processor(Image.fromarray(arr), return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(vitfast.preprocess(arr, config), expected, atol=2e-6, rtol=0, msg=name)


@pytest.mark.parametrize("saved", [True, False])
def test_aimv2_preprocessing_is_clips(tmp_path, saved):
    """transformers pairs AIMv2 with CLIPImageProcessor: a saved one is followed; without one, its defaults
    sized for the model (shortest edge to image_size, centre crop, bicubic, OpenAI's mean/std) are assumed, loudly."""
    vision = dict(image_size=28, patch_size=14, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=176,
                  use_head=False)  # fmt: skip
    transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**vision)).save_pretrained(tmp_path)
    edge = 40 if saved else 28  # without a file: the defaults sized for the model
    processor = processor_class("CLIPImageProcessor")(size={"shortest_edge": edge}, crop_size={"height": 28, "width": 28})
    if saved:
        processor.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning) as record:
        config = vitfast.load_checkpoint(tmp_path).config
    assert ("CLIPImageProcessor defaults assumed" in str(record[0].message)) != saved
    for name, arr in _images(4):
        expected = processor(Image.fromarray(arr), return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(vitfast.preprocess(Image.fromarray(arr), config), expected, atol=2e-6, rtol=0, msg=name)


def _transparent_images(seed: int):
    """Fresh random images with transparency, in the modes that have it: RGBA and LA (an alpha band, fully transparent,
    half and opaque pixels) and P with a transparent palette colour."""
    rng = np.random.default_rng(seed)
    h, w = 50, 60
    alpha = rng.choice(np.array([0, 128, 255], dtype=np.uint8), size=(h, w))
    rgb, grey = rng.integers(0, 256, (h, w, 3), dtype=np.uint8), rng.integers(0, 256, (h, w), dtype=np.uint8)
    yield "RGBA", Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA")
    yield "LA", Image.fromarray(np.dstack([grey, alpha]), mode="LA")
    palette = Image.fromarray(rng.integers(0, 8, (h, w), dtype=np.uint8), mode="P")
    palette.putpalette(rng.integers(0, 256, 8 * 3, dtype=np.uint8).tolist())
    palette.info["transparency"] = 3
    yield "P", palette


@pytest.mark.parametrize("key", ["clip-shortest-edge", "bit", "siglip"])
def test_transparent_images_are_composited_onto_white_as_do_convert_rgb_does(tmp_path, key):
    """CLIP's, Bit's (DINOv2) and SigLIP's processors (do_convert_rgb) put transparent pixels on white, not the colour
    Pillow's convert("RGB") keeps under them; the flag survives a vitfast checkpoint, and image files read for eval do the same."""
    processor, _ = _hf_folder(tmp_path / "hf", key)
    config = vitfast.load_checkpoint(tmp_path / "hf").config
    assert config.alpha_on_white
    for name, image in _transparent_images(4):
        expected = processor(image, return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(vitfast.preprocess(image, config), expected, atol=2e-6, rtol=0, msg=f"{key} {name}")
        dropped = Image.fromarray(np.asarray(image.convert("RGB")))  # alpha dropped (convert alone keeps P's transparent colour in info)
        assert (vitfast.preprocess(dropped, config) - expected).abs().max() > 0.1, name  # the case is a real one
        image.save(tmp_path / f"{name}.png")
        from_file = next(vitfast.data.batches([tmp_path / f"{name}.png"], config, 1, workers=1))
        torch.testing.assert_close(from_file, expected, atol=2e-6, rtol=0, msg=f"{key} {name} file")
    model = vitfast.load_checkpoint(tmp_path / "hf")
    vitfast.save_checkpoint(model, tmp_path / "saved.safetensors")
    assert vitfast.load_checkpoint(tmp_path / "saved.safetensors").config.alpha_on_white


def test_processors_without_do_convert_rgb_and_older_configs_drop_alpha(tmp_path):
    """ViTImageProcessor converts nothing (transformers takes no RGBA image through it); timm and vitfast's own models, and
    configs saved before the flag existed, keep Pillow's convert("RGB")."""
    _hf_folder(tmp_path, "vit-custom")
    for config in (vitfast.load_checkpoint(tmp_path).config, vitfast.create_model("vit_tiny_patch16_224", img_size=32).config,
                   vitfast.ViTConfig.from_dict({k: v for k, v in vitfast.ViTConfig(img_size=32).to_dict().items() if k != "alpha_on_white"})):
        assert not config.alpha_on_white
        for name, image in _transparent_images(5):
            torch.testing.assert_close(vitfast.preprocess(image, config), vitfast.preprocess(image.convert("RGB"), config), atol=0, rtol=0, msg=name)


def test_non_square_processor_size_is_carried_through(tmp_path):
    """ViTImageProcessor with size {height: 32, width: 48} squashes every image to 32x48, and a ViT with image_size
    [32, 48] takes it: the model's img_size is both sides (not the height twice), its pixels and logits are the
    processor's and the model's; --config preprocessor_config.json alone gives the same input size."""
    import json

    from vitfast.foreign import config_file_fields

    processor = processor_class("ViTImageProcessor")(size={"height": 32, "width": 48}, image_mean=[0.3, 0.4, 0.5], image_std=[0.2, 0.3, 0.4])
    hf_cfg = transformers.ViTConfig(image_size=[32, 48], patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, num_labels=3)  # fmt: skip
    hf = transformers.ViTForImageClassification(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    model = vitfast.load_checkpoint(tmp_path)
    assert model.config.img_hw == (32, 48) and not model.config_guesses
    for name, arr in _images(6):
        expected = processor(Image.fromarray(arr), return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(vitfast.preprocess(arr, model.config), expected, atol=2e-6, rtol=0, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(model(expected), hf(pixel_values=expected).logits, atol=1e-5, rtol=0)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert vitfast.ViTConfig(**config_file_fields(saved)[0]).img_hw == (32, 48)


@pytest.mark.parametrize("sizes, why", [
    (dict(size={"height": 40, "width": 56}, crop_size={"height": 32, "width": 32}), "resizes to 40x56 and crops 32x32, which one crop_pct"),
    (dict(size={"height": 32, "width": 48}, do_center_crop=False), "makes 32x48 inputs but config.json's image_size is 32x32"),
])  # fmt: skip
def test_non_square_processor_size_a_model_cannot_take_is_a_loud_guess(tmp_path, sizes, why):
    """A non-square resize that vitfast's one crop_pct cannot follow, or a processor size a square model does not
    take, is said (GuessedConfigWarning, config_guesses), never changed silently."""
    processor = processor_class("DeiTImageProcessor")(**sizes)
    hf_cfg = transformers.DeiTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, num_labels=3)  # fmt: skip
    transformers.DeiTForImageClassification(hf_cfg).save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match=why):
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.img_hw == (32, 32)


@pytest.mark.parametrize("family", ["vit", "deit"])  # transformers' DINOv2 and CLIP towers take square sizes only
def test_non_square_image_size_without_a_processor_file_loads(tmp_path, family):
    """config.json's image_size [h, w] and no preprocessor_config.json: the processor's defaults are sized for both sides
    (reported as guesses), and the model runs the checkpoint's h x w input as transformers does."""
    common = dict(image_size=[32, 48], patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    hf = {
        "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**common, num_labels=3)),
        "deit": lambda: transformers.DeiTForImageClassification(transformers.DeiTConfig(**common, num_labels=3)),
    }[family]().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    with pytest.warns(vitfast.GuessedConfigWarning, match="no preprocessor_config.json"):
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.img_hw == (32, 48)
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        out = hf(pixel_values=x)
        torch.testing.assert_close(model(x), out.logits, atol=1e-5, rtol=0)
