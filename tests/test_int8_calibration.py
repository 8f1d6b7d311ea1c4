"""INT8 quantization: what each --calib-method computes, checked against the calibration images themselves, and the
checks on its inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="export tests need onnx (pip install 'vitfast[export]')")
pytest.importorskip("onnxruntime", reason="export tests need onnxruntime (pip install 'vitfast[export]')")

import vitfast  # noqa: E402
from conftest import randomize  # noqa: E402
from vitfast.export import quantize_int8, to_onnx  # noqa: E402


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    torch.manual_seed(0)
    model = randomize(vitfast.create_model("vit_cifar_patch4_32", depth=1)).eval()  # few tensors: entropy's KL search takes ~1 s each
    return to_onnx(model, tmp_path_factory.mktemp("calib") / "fp32.onnx")


def activation_scales(path) -> dict[str, float]:
    """{tensor: scale} of every activation QuantizeLinear (weights are initializers)."""
    graph = onnx.load(str(path)).graph
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    return {n.input[0]: float(inits[n.input[1]]) for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits}


def spread_images(seed: int) -> torch.Tensor:
    """80 images whose spread grows 15x from the first to the last: every batch of 16 has other extremes."""
    x = torch.randn(80, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return x * torch.linspace(0.2, 3, 80)[:, None, None, None]


def test_minmax_is_the_min_and_max_over_all_calibration_images(fp32, tmp_path):
    """The input's scale is the calibration images' absmax / 127 (symmetric int8), in any batch order: not a mean of
    per-batch extremes, which depended on the order and was narrower than the data."""
    x = spread_images(seed=1)
    calib = x[:64].numpy()  # the held-out 16 are never calibrated on
    forward = activation_scales(quantize_int8(fp32, tmp_path / "fwd.onnx", x, samples=64, progress=False))
    backward = activation_scales(quantize_int8(fp32, tmp_path / "bwd.onnx", torch.cat([x[:64].flip(0), x[64:]]), samples=64, progress=False))
    assert forward["images"] == pytest.approx(np.abs(calib).max() / 127, rel=1e-6)
    assert forward == pytest.approx(backward, rel=1e-6)


def test_entropy_clips_a_heavy_tailed_activation_and_keeps_parity(fp32, tmp_path):
    """Entropy (KL) calibration on 2048 bins (TensorRT's search on |x|) clips the rare outliers of a heavy-tailed input
    that min/max must cover; the int8 model still matches fp32 on held-out images. quantize_static alone ran it on
    128 bins with one candidate threshold, the full range: the same scale as min/max."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(80, 3, 32, 32, generator=gen)
    outliers = torch.rand(x.shape, generator=gen) < 1e-4  # ~20 pixels of 245,760, 10-16x the spread (inside what is taken)
    x[outliers] = torch.empty(int(outliers.sum())).uniform_(10, 16, generator=gen) * torch.randn(int(outliers.sum()), generator=gen).sign()
    absmax = x[:64].abs().max().item()
    scales, metas = {}, {}
    for method in ("minmax", "entropy"):
        out = quantize_int8(fp32, tmp_path / f"{method}.onnx", x, samples=64, method=method, progress=False)
        scales[method], metas[method] = activation_scales(out), vitfast.export.read_sidecar(out)
    assert scales["minmax"]["images"] == pytest.approx(absmax / 127, rel=1e-6)
    assert scales["entropy"]["images"] < 0.5 * absmax / 127  # the outliers are clipped, not covered
    assert metas["entropy"]["int8"]["calibrator"] == {"num_bins": 2048, "num_quantized_bins": 128, "search": "tensorrt"}
    assert metas["entropy"]["parity"]["passed"] and metas["entropy"]["parity"]["cosine"] > 0.99


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, np.uint8])
def test_raw_pixel_calibration_data_is_refused(fp32, tmp_path, dtype):
    """Un-normalised integer images calibrated the ranges on the wrong scale, and the held-out parity, measured on the
    same wrong data, still passed: they are refused, pointing to vitfast.preprocess."""
    gen = torch.Generator().manual_seed(3)
    raw = torch.randint(0, 256, (40, 3, 32, 32), generator=gen)
    raw = raw.numpy().astype(dtype) if isinstance(dtype, type) else raw.to(dtype)
    with pytest.raises(vitfast.InputError, match=r"got (uint8|int64) values.*vitfast\.preprocess"):
        quantize_int8(fp32, tmp_path / "raw.onnx", raw, samples=32, progress=False)
    with pytest.raises(vitfast.InputError, match="vitfast.preprocess"):
        quantize_int8(fp32, tmp_path / "raw.onnx", [raw[:20], raw[20:]], samples=32, progress=False)  # batches alike
    assert not (tmp_path / "raw.onnx").exists()


def test_float_pixels_on_the_0_to_255_scale_are_refused(fp32, tmp_path, monkeypatch):
    """Float images on the 0..255 scale were taken: the input's int8 scale came out ~2.0 (a normalised image used ~3 of
    255 levels), and the held-out parity, measured on the same wrong-scale images, passed. The brightest and darkest
    images the model's own preprocessing makes are still taken."""
    import vitfast.export.quantize as quantize

    cfg = vitfast.get_config("vit_cifar_patch4_32", depth=1)
    pixels = torch.randint(0, 256, (40, 32, 32, 3), generator=torch.Generator().manual_seed(4), dtype=torch.uint8)
    raw = pixels.permute(0, 3, 1, 2).float()
    monkeypatch.setattr(quantize, "calibrate", lambda *a, **k: pytest.fail("calibrated on 0..255 floats"))
    for data in (raw, [raw[:20], raw[20:]], raw.numpy().astype(np.float64)):
        with pytest.raises(vitfast.InputError, match=r"values from 0 to 255, far beyond .*0\.\.255 scale.*vitfast\.preprocess"):
            quantize_int8(fp32, tmp_path / "raw.onnx", data, samples=32, progress=False)
    assert not (tmp_path / "raw.onnx").exists()
    extremes = vitfast.preprocess(torch.tensor([0, 255], dtype=torch.uint8)[:, None, None, None].expand(2, 32, 32, 3), cfg)
    assert quantize._calibration_array(extremes, cfg).min() == pytest.approx(quantize.pixel_range(cfg)[0], rel=1e-5)
    assert quantize._calibration_array(extremes, cfg).max() == pytest.approx(quantize.pixel_range(cfg)[1], rel=1e-5)


@pytest.mark.parametrize("percentile", [150, 0, -1, float("nan"), "99.9", True])
def test_a_percentile_outside_0_to_100_is_refused_before_calibration(fp32, tmp_path, monkeypatch, percentile):
    """percentile=150 failed after the calibration with ONNX Runtime's ValueError, and 0 was accepted."""
    import vitfast.export.quantize as quantize

    monkeypatch.setattr(quantize, "calibrate", lambda *a, **k: pytest.fail("calibrated before checking the percentile"))
    with pytest.raises(vitfast.InputError, match=r"percentile must be a number in \(0, 100\]"):
        quantize_int8(fp32, tmp_path / "p.onnx", torch.randn(20, 3, 32, 32), samples=16, method="percentile", percentile=percentile)
    assert not (tmp_path / "p.onnx").exists()


def test_percentile_100_is_the_absolute_max(fp32, tmp_path):
    """Also on 40 images, batches of 16, 16 and 8: ONNX Runtime's histogram calibrators, given every batch at once,
    failed on the short one with numpy's "inhomogeneous shape" ValueError."""
    x = spread_images(seed=5)
    out = quantize_int8(fp32, tmp_path / "p100.onnx", x, samples=40, method="percentile", percentile=100, progress=False)
    assert activation_scales(out)["images"] == pytest.approx(x[:40].abs().max().item() / 127, rel=1e-6)
    assert vitfast.export.read_sidecar(out)["int8"]["calibrator"] == {"num_bins": 2048, "percentile": 100}


def dequantized_layers(path) -> dict[str, bool]:
    """{node: whether a DequantizeLinear feeds its data input} for each Conv, MatMul and Gemm of the graph at `path`."""
    graph = onnx.load(str(path)).graph
    produced_by = {o: n.op_type for n in graph.node for o in n.output}
    return {n.name: produced_by.get(n.input[0]) == "DequantizeLinear" for n in graph.node if n.op_type in ("Conv", "MatMul", "Gemm")}


def exported_from(path) -> dict[str, str]:
    """{node: the innermost module torch.onnx's `namespace` metadata names}, read here apart from vitfast's reader."""
    graph = onnx.load(str(path)).graph
    scopes = {n.name: next((p.value for p in n.metadata_props if p.key == "namespace"), "") for n in graph.node}
    return {name: scope.split("/")[-2].split(":")[0] for name, scope in scopes.items() if scope.count("/")}


def test_exclude_takes_the_module_paths_nodes_came_from(fp32, tmp_path):
    """--exclude matched ONNX node names only (node_Conv_..., never shown to a CLI user), not the module paths the
    keep_float ranking prints."""
    x = vitfast.data.random_images(vitfast.get_config("vit_cifar_patch4_32"), 24, seed=6)
    out = quantize_int8(fp32, tmp_path / "x.onnx", x, samples=16, exclude=["patch_embed.proj", "blocks.0.mlp.*"], progress=False)
    modules = exported_from(fp32)
    kept = {n for n, m in modules.items() if m == "patch_embed.proj" or m.startswith("blocks.0.mlp.")}
    layers = dequantized_layers(out)
    assert kept & set(layers) and not any(layers[n] for n in kept & set(layers))  # the conv, fc1 and fc2 stay float
    assert any(q for n, q in layers.items() if n not in kept)  # and the rest is quantized
    with pytest.raises(vitfast.ArtifactError, match=r"\['blocks\.9\.\*'\] match no node name or module path.*module paths like"):
        quantize_int8(fp32, tmp_path / "y.onnx", x, samples=16, exclude=["blocks.0.mlp.*", "blocks.9.*"], progress=False)
    assert not (tmp_path / "y.onnx").exists()


def test_an_exclude_typo_is_told_before_calibrating(fp32, tmp_path, monkeypatch):
    """A pattern matching no node was told only after the whole calibration (in the CLI also after the fp32 export)."""
    import vitfast.export.quantize as quantize

    monkeypatch.setattr(quantize, "calibrate", lambda *a, **k: pytest.fail("calibrated before checking exclude"))
    with pytest.raises(vitfast.ArtifactError, match=r"\['node_Conv_9O\*'\] match no node name or module path"):
        quantize_int8(fp32, tmp_path / "y.onnx", torch.randn(20, 3, 32, 32), samples=16, exclude=["node_*", "node_Conv_9O*"], progress=False)
    assert not (tmp_path / "y.onnx").exists()


def test_too_large_keep_float_is_refused_before_the_sensitivity_sweep(fp32, tmp_path, monkeypatch):
    """keep_float larger than the quantized layers was refused only after one ONNX Runtime run per layer."""
    import vitfast.export.quantize as quantize

    x = vitfast.data.random_images(vitfast.get_config("vit_cifar_patch4_32"), 24, seed=6)
    n_layers = sum(dequantized_layers(quantize_int8(fp32, tmp_path / "q.onnx", x, samples=16, progress=False)).values())
    monkeypatch.setattr(quantize, "rank_layers", lambda *a, **k: pytest.fail("ran the sweep before checking keep_float"))
    with pytest.raises(vitfast.InputError, match=f"keep_float={n_layers + 1} but the graph has {n_layers} quantized layers"):
        quantize_int8(fp32, tmp_path / "k.onnx", x, samples=16, keep_float=n_layers + 1, progress=False)
    assert not (tmp_path / "k.onnx").exists()


def test_quantizing_a_file_onto_itself_is_refused(fp32, tmp_path):
    """With force=True the int8 file replaced the fp32 graph it came from, its quantized_from naming itself."""
    import shutil

    for suffix in ("", ".json"):
        shutil.copy(f"{fp32}{suffix}", tmp_path / f"m.onnx{suffix}")
    before = (tmp_path / "m.onnx").read_bytes()
    (tmp_path / "sub").mkdir()
    for out in (tmp_path / "m.onnx", tmp_path / "sub" / ".." / "m.onnx"):
        with pytest.raises(vitfast.ArtifactError, match="is the fp32 graph being quantized; write the int8 file to another path"):
            quantize_int8(tmp_path / "m.onnx", out, torch.randn(20, 3, 32, 32), samples=16, force=True, progress=False)
    assert (tmp_path / "m.onnx").read_bytes() == before and vitfast.export.read_sidecar(tmp_path / "m.onnx")["precision"] == "fp32"


def test_a_missing_onnx_file_is_not_found_not_missing_its_sidecar(fp32, tmp_path):
    """quantize_int8 said "has no sidecar ...; re-export it" of a path that does not exist."""
    missing = tmp_path / "nothere.onnx"
    with pytest.raises(vitfast.ArtifactError, match=f"^no such artifact: {missing}$"):
        quantize_int8(missing, tmp_path / "q.onnx", torch.randn(20, 3, 32, 32), samples=16, progress=False)
    with pytest.raises(vitfast.ArtifactError, match="no such artifact"):
        vitfast.export.read_sidecar(missing)
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(fp32.read_bytes())  # a file that is there without its sidecar is still told so
    with pytest.raises(vitfast.ArtifactError, match="has no sidecar bare.onnx.json"):
        quantize_int8(bare, tmp_path / "q.onnx", torch.randn(20, 3, 32, 32), samples=16, progress=False)


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    """A tiny R26+ViT-S/32 exported twice: {"bit": each bottleneck's last GroupNorm scale near 0, as timm's
    zero_init_last option (off by default) and trained BiT stems have it, so a block starts close to its shortcut;
    "random": every norm scale near 1, a stem that amplifies what its convs' int8 error leaves}."""
    root = tmp_path_factory.mktemp("hybrid")
    cfg = vitfast.get_config("vit_small_r26_s32_224", img_size=64, depth=1, embed_dim=64, num_heads=2, num_classes=5)
    torch.manual_seed(0)
    model = randomize(vitfast.create_model(cfg)).eval()
    files = {"random": to_onnx(model, root / "random.onnx")}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm3.weight"):
                p.copy_(0.1 * torch.randn_like(p))
    files["bit"] = to_onnx(model, root / "bit.onnx")
    return files | {"images": vitfast.data.random_images(cfg, 16 + 64, seed=1)}


def test_a_hybrid_quantizes_every_stem_conv_as_documented(hybrids, tmp_path):
    """Q/DQ goes on the inputs of every Conv, MatMul and Gemm: in a hybrid, each ResNet stem convolution as well as
    the patch projection (the docs said "the patch Conv"), with per-channel weights; the stem's norms stay float. With
    a BiT-like init the int8 file keeps parity on 64 held-out images."""
    fp32 = hybrids["bit"]
    out = quantize_int8(fp32, tmp_path / "hybrid.int8.onnx", hybrids["images"], samples=16, progress=False)
    graph = onnx.load(str(out)).graph
    produced_by = {o: n for n in graph.node for o in n.output}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert len(convs) == len([n for n in onnx.load(str(fp32)).graph.node if n.op_type == "Conv"]) == 30  # stem 29 + patch 1
    for conv in convs:
        data, weight = (produced_by[i] for i in conv.input[:2])
        assert data.op_type == weight.op_type == "DequantizeLinear", conv.name
        assert inits[weight.input[1]].size > 1, f"{conv.name}: per-channel weight scales"
    norms = [n for n in graph.node if n.op_type in ("InstanceNormalization", "BatchNormalization", "LayerNormalization")]
    assert norms and all(n.input[0] not in produced_by or produced_by[n.input[0]].op_type != "DequantizeLinear" for n in norms)
    parity = vitfast.export.read_sidecar(out)["parity"]
    assert parity["passed"] and parity["inputs"].startswith("64 held-out"), parity


def test_a_badly_conditioned_hybrid_stem_kept_float_restores_parity(hybrids, tmp_path):
    """With every stem norm scale near 1 the int8 stem's error grows block by block (cosine 0.981 on 64 held-out
    images); the ParityWarning says to keep the stem float by its module path, which restores parity."""
    with pytest.warns(vitfast.errors.ParityWarning, match=r"parity FAILED.*keep it float with --exclude 'patch_embed\.backbone\.\*'"):
        quantize_int8(hybrids["random"], tmp_path / "q.onnx", hybrids["images"], samples=16, progress=False)
    out = quantize_int8(hybrids["random"], tmp_path / "stem.onnx", hybrids["images"], samples=16, exclude=["patch_embed.backbone.*"],
                        progress=False)  # fmt: skip
    parity = vitfast.export.read_sidecar(out)["parity"]
    assert parity["passed"] and parity["inputs"].startswith("64 held-out") and "advice" not in parity, parity
    modules, layers = exported_from(hybrids["random"]), dequantized_layers(out)
    convs = {n.name for n in onnx.load(str(hybrids["random"])).graph.node if n.op_type == "Conv"}
    stem = {n for n in convs if modules[n].startswith("patch_embed.backbone.")}
    assert len(stem) == 29 and not any(layers[n] for n in stem)  # every stem conv float
    assert all(layers[n] for n in convs - stem) and any(q for n, q in layers.items() if n not in stem)  # the patch proj and blocks int8
