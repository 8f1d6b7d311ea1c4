"""Dynamic image size (timm's `dynamic_img_size`; `--dynamic-img-size`): one model, and one exported graph, for any
H x W in whole patches, the position embeddings and rotary tables fitted to each input's patch grid.

The model is checked here against a fixed-size model of the same weights built at the input's size (the load-time
resize and the rotary tables of a fixed grid: another route) and against transformers (`interpolate_pos_encoding`),
then through checkpoints and export. timm's own `dynamic_img_size` is the reference in test_timm_parity.py."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import vitfast
from conftest import DINOV3, randomize, tiny_config
from vitfast.errors import ConfigError, InputError
from vitfast.export import quantize_int8, to_onnx, triton_repository
from vitfast.export import tensorrt as trt_export
from vitfast.runtime.sidecar import read_sidecar

ATOL = 1e-5
# (config, another grid to run it at): odd and non-square grids, prefix tokens of every kind, rotary positions, a hybrid stem
VARIANTS = {
    "registers-5x3": (tiny_config(img_size=(40, 24), reg_tokens=2, depth=2), (3, 7)),
    "distilled": (tiny_config(distilled=True, depth=2), (6, 5)),
    "no-embed-class-layer-scale": (tiny_config(no_embed_class=True, reg_tokens=1, init_values=0.1, depth=2), (2, 3)),
    "avg-no-class-token": (tiny_config(class_token=False, global_pool="avg", depth=2), (5, 5)),
    "dinov3-rope": (tiny_config(**DINOV3 | dict(depth=2)), (3, 6)),
    "axial-rope-ref-grid": (tiny_config(rope="axial", rope_ref_grid=(3, 3), abs_pos_embed=False, depth=2), (5, 4)),
    "hybrid": (vitfast.get_config("vit_small_r26_s32_224", img_size=64, depth=2, embed_dim=64, num_heads=2, num_classes=5), (3, 1)),
}


def _dynamic(model: vitfast.VisionTransformer, **overrides) -> vitfast.VisionTransformer:
    twin = vitfast.create_model(model.config.replace(dynamic_img_size=True, **overrides)).eval()
    twin.load_state_dict({k: v for k, v in model.state_dict().items() if k in twin.state_dict()})  # features, tokens: no head
    return twin


@pytest.mark.parametrize("name", list(VARIANTS))
def test_dynamic_model_equals_fixed_models_at_every_size(tmp_path, name):
    """At its own size the dynamic model is the fixed one, exactly (bicubic at scale 1 returns its input); at another
    grid it is the fixed model loaded at that size from the same checkpoint (timm's rule: resized once, antialiased)."""
    cfg, (gh, gw) = VARIANTS[name]
    fixed = randomize(vitfast.create_model(cfg)).eval()
    dynamic = _dynamic(fixed)
    vitfast.save_checkpoint(fixed, tmp_path / "m.safetensors")
    p = cfg.patch_size
    with torch.no_grad():
        x = torch.randn(2, 3, *cfg.img_hw)
        assert torch.equal(dynamic(x), fixed(x))
        x = torch.randn(2, 3, gh * p, gw * p)
        other = vitfast.load_checkpoint(tmp_path / "m.safetensors", img_size=(gh * p, gw * p))
        torch.testing.assert_close(dynamic(x), other(x), atol=ATOL, rtol=0)
        with pytest.raises(InputError, match="images of"):
            fixed(x)


def test_feature_maps_and_tokens_follow_the_input_grid():
    cfg = tiny_config(img_size=(40, 24), reg_tokens=2, depth=3)
    model = randomize(vitfast.create_model(cfg)).eval()
    x = torch.randn(2, 3, 56, 32)  # 7 x 4 patches of 8
    with torch.no_grad():
        tokens = _dynamic(model, num_classes=0, global_pool="")(x)
        maps = _dynamic(model, features_only=True, out_indices=(0, 2))(x)
        nlc = _dynamic(model, features_only=True, out_indices=(0, 2), output_fmt="NLC")(x)
    assert tokens.shape == (2, 3 + 28, cfg.embed_dim) and maps.shape == (2, 2, cfg.embed_dim, 7, 4)
    torch.testing.assert_close(maps, nlc.reshape(2, 2, 7, 4, -1).permute(0, 1, 4, 2, 3), atol=0, rtol=0)
    assert _dynamic(model, features_only=True).config.output_shape == (3, cfg.embed_dim, None, None)
    assert _dynamic(model, num_classes=0, global_pool="").config.output_shape == (None, cfg.embed_dim)
    assert _dynamic(model).config.output_shape == (cfg.num_classes,)


@pytest.mark.parametrize("hw, named", [((57, 32), "57x32"), ((56, 4), "56x4"), ((0, 8), "0x8")])
def test_images_not_in_whole_patches_are_refused_with_a_size_that_fits(hw, named):
    model = vitfast.create_model(tiny_config(dynamic_img_size=True)).eval()
    with pytest.raises(InputError, match=f"images of {named} are not whole 8x8 patches.*e.g. "):
        model(torch.randn(1, 3, *hw))


def test_config_round_trips_and_refuses_a_stored_grid_without_dynamic_img_size():
    cfg = tiny_config(dynamic_img_size=True, pos_embed_grid=(5, 5), pos_embed_antialias=False)
    assert vitfast.ViTConfig.from_json(cfg.to_json()) == cfg and cfg.pos_grid == (5, 5)
    assert vitfast.create_model(cfg).pos_embed.shape[1] == 1 + 25
    with pytest.raises(ConfigError, match="pos_embed_grid .* needs dynamic_img_size=True"):
        tiny_config(pos_embed_grid=(5, 5))
    with pytest.raises(ConfigError, match="needs dynamic_img_size=True and abs_pos_embed=True"):
        tiny_config(dynamic_img_size=True, pos_embed_grid=(5, 5), abs_pos_embed=False, rope="dinov3")
    with pytest.raises(ConfigError, match="two positive integers"):
        tiny_config(dynamic_img_size=True, pos_embed_grid=(5, 0))


# ---------------------------------------------------------------------------- transformers' interpolate_pos_encoding
def _transformers():
    return pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e .[test])")


SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
HF_MODELS = {  # (model, output, whether forward needs interpolate_pos_encoding=True)
    "vit": (lambda tf: tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, intermediate_size=128,
                                                                                  num_labels=5, **SMALL)), "logits", True),
    "dinov2": (lambda tf: tf.Dinov2Model(tf.Dinov2Config(image_size=28, patch_size=7, layerscale_value=0.5, **SMALL)),
               "pooler_output", False),
    "dinov2-registers": (lambda tf: tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(
        image_size=28, patch_size=7, layerscale_value=0.5, num_register_tokens=4, **SMALL)), "pooler_output", False),
    "clip": (lambda tf: tf.CLIPVisionModelWithProjection(tf.CLIPVisionConfig(
        image_size=32, patch_size=8, intermediate_size=128, projection_dim=24, **SMALL)), "image_embeds", True),
    "siglip": (lambda tf: tf.SiglipVisionModel(tf.SiglipVisionConfig(image_size=32, patch_size=8, intermediate_size=160,
                                                                                      **SMALL)), "pooler_output", True),
    "dinov3": (lambda tf: tf.DINOv3ViTModel(tf.DINOv3ViTConfig(image_size=32, patch_size=8, intermediate_size=128,
                                                                                **SMALL)), "pooler_output", False),
}  # fmt: skip


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_hugging_face_folder_matches_interpolate_pos_encoding_at_every_size(tmp_path, name):
    """A dynamic model of an HF folder resizes the stored table in every forward by transformers' rule (plain bicubic;
    antialiased for Dinov2WithRegisters), as transformers does: equal at the stored grid and at four others."""
    make, output, flag = HF_MODELS[name]
    hf = randomize(make(_transformers()), scale=0.05).eval()
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vitfast.GuessedConfigWarning)  # no preprocessor_config.json: its defaults
        model = vitfast.load_checkpoint(tmp_path, overrides={"dynamic_img_size": True})
    assert model.config.pos_embed_antialias == (name not in ("vit", "dinov2", "clip", "siglip"))
    p = model.config.patch_size
    for gh, gw in [model.config.grid_size, (6, 6), (3, 5), (7, 2), (1, 1)]:
        x = torch.randn(2, 3, gh * p, gw * p)
        with torch.no_grad():
            want = getattr(hf(pixel_values=x, **({"interpolate_pos_encoding": True} if flag else {})), output)
            torch.testing.assert_close(model(x), want, atol=ATOL, rtol=0, msg=f"{gh}x{gw} patches")


@pytest.mark.parametrize("registers", [0, 4])
def test_hf_dinov2_keeps_its_stored_table_and_resizes_from_it(tmp_path, registers):
    """DINOv2 stores a larger table than its processor's crop (facebook/dinov2-*: 37x37 for 224 px). transformers
    resizes the stored table at every size; so does the dynamic model, which keeps it (pos_embed_grid), also after a
    save and reload. A fixed model resized once to the crop's grid would differ at other sizes."""
    make, tf = HF_MODELS["dinov2-registers" if registers else "dinov2"][0], _transformers()
    hf = randomize(make(tf), scale=0.05).eval()  # 28 px / 7: a 4x4 table
    hf.save_pretrained(tmp_path)
    tf.BitImageProcessor(size={"shortest_edge": 35}, crop_size={"height": 35, "width": 35}).save_pretrained(tmp_path)
    model = vitfast.load_checkpoint(tmp_path, overrides={"dynamic_img_size": True})
    assert (model.config.img_size, model.config.pos_embed_grid, model.pos_embed.shape[1]) == (35, (4, 4), 1 + 16 if not registers else 16)
    vitfast.save_checkpoint(model, tmp_path / "ours.safetensors")
    again = vitfast.load_checkpoint(tmp_path / "ours.safetensors")
    for gh, gw in [(5, 5), (8, 3)]:
        x = torch.randn(2, 3, gh * 7, gw * 7)
        with torch.no_grad():
            want = hf(pixel_values=x).pooler_output
            torch.testing.assert_close(model(x), want, atol=ATOL, rtol=0)
            torch.testing.assert_close(again(x), want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------- export and the runtime
def _onnx():
    return pytest.importorskip("onnx", reason="export tests need onnx and onnxruntime: pip install -e .[onnx]")


EXPORTED = {  # (config, another grid to run the graph at)
    "registers-5x3": VARIANTS["registers-5x3"],
    "feature-maps": (tiny_config(img_size=(40, 24), reg_tokens=2, depth=2, features_only=True, out_indices=(0, 1)), (7, 2)),
    "dinov3-rope": VARIANTS["dinov3-rope"],
    "hybrid": VARIANTS["hybrid"],
}


@pytest.fixture(scope="module", params=list(EXPORTED))
def exported(request, tmp_path_factory):
    _onnx()
    cfg, grid = EXPORTED[request.param]
    model = randomize(vitfast.create_model(cfg.replace(dynamic_img_size=True))).eval()
    return model, to_onnx(model, tmp_path_factory.mktemp("dyn") / "m.onnx"), grid


def test_the_graph_takes_any_size_and_matches_the_model(exported):
    model, path, (gh, gw) = exported
    meta, p = read_sidecar(path), model.config.patch_size
    assert meta["input"]["shape"] == ["batch", 3, "height", "width"] and meta["onnx"]["dynamic_img_size"]
    sizes = [o["img_size"] for o in meta["parity"]["other_sizes"]]
    assert meta["parity"]["passed"] and len(sizes) == 2 and list(model.config.img_hw) not in sizes
    graph_input = _onnx().load(path).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param != "" for d in graph_input] == [True, False, True, True]
    engine = vitfast.load_engine(path, backend="onnxruntime")
    x = torch.randn(3, 3, gh * p, gw * p)
    with torch.no_grad():
        torch.testing.assert_close(engine(x), model(x), atol=1e-4, rtol=0)
    with pytest.raises(InputError, match=f"not whole {p}x{p} patches"):
        engine(torch.randn(1, 3, gh * p + 1, gw * p))
    hw = (gh * p, gw * p)  # the size raw images are resized to is the user's to choose for such a graph
    resized = vitfast.load_engine(path, backend="onnxruntime", overrides={"img_size": hw})
    raw = np.random.default_rng(3).integers(0, 256, (2, 50, 45, 3), dtype=np.uint8)
    with torch.no_grad():
        torch.testing.assert_close(resized(raw), model(vitfast.preprocess(raw, model.config.replace(img_size=hw))), atol=1e-4, rtol=0)


def test_fp16_and_int8_graphs_are_checked_at_every_size(tmp_path):
    _onnx()
    cfg, (gh, gw) = VARIANTS["registers-5x3"]
    model = randomize(vitfast.create_model(cfg.replace(dynamic_img_size=True))).eval()
    fp16 = to_onnx(model, tmp_path / "h.onnx", precision="fp16")
    fp32 = to_onnx(model, tmp_path / "f.onnx")
    int8 = quantize_int8(fp32, tmp_path / "q.onnx", torch.randn(16, 3, *cfg.img_hw), samples=12, progress=False)
    for path in (fp16, int8):
        parity = read_sidecar(path)["parity"]
        assert parity["passed"] and [o["passed"] for o in parity["other_sizes"]] == [True, True], path
    engine = vitfast.load_engine(int8, backend="onnxruntime")
    x = torch.randn(2, 3, gh * 8, gw * 8)
    with torch.no_grad():
        assert torch.nn.functional.cosine_similarity(engine(x), model(x)).min() > 0.99


def test_a_failing_size_fails_the_whole_parity():
    from vitfast.parity import with_other_sizes

    ok, bad = {"passed": True}, {"passed": False, "img_size": [8, 8]}
    assert with_other_sizes(ok, [ok | {"img_size": [8, 16]}, bad])["passed"] is False
    assert with_other_sizes(ok, []) == ok


def test_openvino_refuses_an_antialiased_resize_and_runs_transformers_plain_one(tmp_path):
    """OpenVINO's antialiased cubic Resize is off PyTorch's (measured up to 0.09 on these features); the plain one agrees."""
    _onnx()
    pytest.importorskip("openvino", reason="OpenVINO tests need pip install -e .[openvino]")
    cfg = tiny_config(img_size=(40, 24), reg_tokens=2, features_only=True, out_indices=(0, 1), dynamic_img_size=True)
    timm_rule = to_onnx(randomize(vitfast.create_model(cfg)).eval(), tmp_path / "timm.onnx")
    with pytest.raises(vitfast.ArtifactError, match="antialiased bicubic Resize.*backend onnxruntime"):
        vitfast.load_engine(timm_rule, backend="openvino")
    int8 = quantize_int8(timm_rule, tmp_path / "timm.int8.onnx", torch.randn(8, 3, *cfg.img_hw), samples=6, progress=False)
    assert vitfast.load_engine(int8).kind == "onnxruntime"  # auto: OpenVINO for int8 files, but not for this one
    hf_model = randomize(vitfast.create_model(cfg.replace(pos_embed_antialias=False))).eval()
    engine = vitfast.load_engine(to_onnx(hf_model, tmp_path / "hf.onnx"), backend="openvino")
    for gh, gw in [(2, 2), (8, 6), (5, 2)]:
        x = torch.randn(2, 3, gh * 8, gw * 8)
        with torch.no_grad():
            torch.testing.assert_close(engine(x), hf_model(x), atol=1e-5, rtol=0)


def test_check_runs_the_other_sizes_and_says_so(exported, capsys):
    from vitfast.cli.main import main

    model, path, _ = exported
    checkpoint = path.with_suffix(".safetensors")
    vitfast.save_checkpoint(model, checkpoint)
    assert main(["check", str(path), "--checkpoint", str(checkpoint), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and len(result["other_sizes"]) == 2 and all(o["passed"] for o in result["other_sizes"])
    assert main(["check", str(path), "--checkpoint", str(checkpoint)]) == 0
    assert capsys.readouterr().out.count(" passed (max_abs_err") == 2


def test_check_against_compares_two_dynamic_size_artifacts_at_other_sizes_too(tmp_path, capsys):
    """Two graphs of the same weights whose position-embedding resize differs (timm's antialiased rule vs
    transformers' plain bicubic) are equal at img_size, where the resize is the identity, and differ at other
    sizes: `check --against` compares at those too and fails. The same graph against its checkpoint passes at
    every size; against a fixed-size artifact it compares at img_size alone."""
    from vitfast.cli.main import main

    _onnx()
    cfg = tiny_config(img_size=(40, 24), reg_tokens=1, depth=2, dynamic_img_size=True)
    timm_rule = randomize(vitfast.create_model(cfg)).eval()
    hf_rule = vitfast.create_model(cfg.replace(pos_embed_antialias=False)).eval()
    hf_rule.load_state_dict(timm_rule.state_dict())
    vitfast.save_checkpoint(timm_rule, tmp_path / "m.safetensors")
    fixed = vitfast.create_model(cfg.replace(dynamic_img_size=False)).eval()
    fixed.load_state_dict(timm_rule.state_dict())
    paths = {name: to_onnx(m, tmp_path / f"{name}.onnx") for name, m in [("timm", timm_rule), ("hf", hf_rule), ("fixed", fixed)]}

    def check(a, b):
        code = main(["check", str(a), "--against", str(b), "--json"])
        return code, json.loads(capsys.readouterr().out)

    code, same = check(paths["timm"], tmp_path / "m.safetensors")
    assert code == 0 and [o["img_size"] for o in same["other_sizes"]] == [[64, 8], [16, 64]]
    assert all(o["passed"] and o["max_abs_err"] < 1e-4 for o in same["other_sizes"])
    code, rules = check(paths["timm"], paths["hf"])
    assert code == 1 and not rules["passed"] and rules["max_abs_err"] < 1e-5  # equal at img_size, apart elsewhere
    assert not any(o["passed"] for o in rules["other_sizes"])
    code, mixed = check(paths["timm"], paths["fixed"])
    assert code == 0 and "other_sizes" not in mixed


def test_trtexec_builds_a_dynamic_size_graph_for_half_to_twice_its_size(exported):
    model, path, _ = exported
    (h, w), name = model.config.img_hw, "images"
    line = trt_export.trtexec_command(path, "m.engine", precision="fp16", batch=(1, 1, 1))
    lo = "x".join(str(max(d // 2 // model.config.patch_size, 1) * model.config.patch_size) for d in (h, w))
    assert f"--minShapes={name}:1x3x{lo} --optShapes={name}:1x3x{h}x{w} --maxShapes={name}:1x3x{2 * h}x{2 * w}" in line


def test_triton_repository_declares_any_height_and_width(exported, tmp_path):
    pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="config tests need tritonclient[grpc]: pip install 'vitfast[serve]'")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    model, path, _ = exported
    repo = triton_repository(path, tmp_path / "repo")
    parsed = {d.name: text_format.Parse(d.joinpath("config.pbtxt").read_text(), model_config_pb2.ModelConfig())
              for d in repo.iterdir() if d.joinpath("config.pbtxt").is_file()}  # fmt: skip
    net = next(c for c in parsed.values() if c.platform == "onnxruntime_onnx")
    assert list(net.input[0].dims) == [3, -1, -1]
    assert list(net.output[0].dims) == [-1 if d is None else d for d in model.config.output_shape]
    assert list(net.model_warmup[0].inputs["images"].dims) == [3, *model.config.img_hw]
    pre = next(c for c in parsed.values() if c.backend == "python")
    assert list(pre.output[0].dims) == [3, *model.config.img_hw]  # raw images are resized to img_size
