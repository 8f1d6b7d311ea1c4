"""Guards found in review: --out named for its format and never an input, --force covering --out only, a changed
source checkpoint, every --samples image compared, ambiguous class folders, --config's guesses, seeded inspect,
tolerance flags, and sidecars that name no deleted temporary."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import vitfast
from conftest import randomize, tiny_config
from vitfast.cli import export as cli_export
from vitfast.cli import main
from vitfast.export import read_sidecar
from vitfast.export.artifacts import write_sidecar


def _checkpoint(path, seed, **fields):
    torch.manual_seed(seed)
    return vitfast.save_checkpoint(randomize(vitfast.create_model(tiny_config(**fields))), path)


def _images(folder, n, seed):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (40, 36, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("vitfast: error:") == 1 and "Traceback" not in err
    return err


# ---------------------------------------------------------------------------- 1, 2: --out
@pytest.mark.parametrize("fmt, out", [("onnx", "y.engine"), ("onnx", "y.plan"), ("trt", "x.onnx"), ("trt", "x.safetensors")])
def test_export_refuses_an_out_that_does_not_fit_the_format(tmp_path, capsys, fmt, out):
    ckpt = _checkpoint(tmp_path / "m.safetensors", 0)
    before = set(tmp_path.rglob("*"))
    assert main(["export", "--checkpoint", str(ckpt), "--format", fmt, "--out", str(tmp_path / out), "--force"]) == 2
    err = _one_error_line(capsys)
    assert f"does not fit --format {fmt}: name an ONNX export .onnx and a TensorRT engine .engine / .plan / .trt" in err
    assert set(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_export_force_never_replaces_the_checkpoint_it_exports(tmp_path, capsys, link):
    ckpt = _checkpoint(tmp_path / "w.onnx", 1)  # named so that the suffix check passes: the path itself is refused
    out = {"same": ckpt, "symlink": tmp_path / "link.onnx", "hardlink": tmp_path / "hard.onnx"}[link]
    if link == "symlink":
        out.symlink_to(ckpt)
    elif link == "hardlink":
        os.link(ckpt, out)
    data = ckpt.read_bytes()
    assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--out", str(out), "--force"]) == 2
    assert "is the --checkpoint being exported (--force replaces only an earlier output)" in _one_error_line(capsys)
    assert ckpt.read_bytes() == data and not (tmp_path / "w.onnx.json").exists()


def test_trt_export_without_tensorrt_never_replaces_the_onnx_beside_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_export, "require_tensorrt", _no_tensorrt)
    theirs = tmp_path / "vit.onnx"
    theirs.write_bytes(os.urandom(64))  # someone else's file where the ONNX for trtexec would go
    data = theirs.read_bytes()
    assert main(["export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--out", str(tmp_path / "vit.engine"), "--force"]) == 2
    err = _one_error_line(capsys)
    assert f"writes the ONNX for trtexec to {theirs}, and {theirs} exists (--force replaces it only when it is a vitfast export" in err
    assert theirs.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == ["vit.onnx"]
    # a vitfast export there (make demo's model.onnx) is made again with --force, refused without it
    theirs.unlink()
    assert main(["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--out", str(theirs)]) == 0
    trt = ["export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--out", str(tmp_path / "vit.engine")]
    assert main(trt) == 2 and "exists" in _one_error_line(capsys)
    assert main([*trt, "--force"]) == 2 and "trtexec --onnx=" in capsys.readouterr().err
    assert read_sidecar(theirs)["precision"] == "fp32"


def _no_tensorrt():
    raise vitfast.errors.BackendUnavailable("TensorRT is not installed: pip install tensorrt")


def test_trt_export_builds_from_an_onnx_in_staging_and_leaves_only_the_engine(tmp_path, monkeypatch):
    """With TensorRT, the engine's ONNX is an intermediate: built in the staging folder, recorded by hash, never beside --out."""
    theirs = tmp_path / "vit.onnx"
    theirs.write_bytes(os.urandom(64))
    data = theirs.read_bytes()
    built = {}

    def build_engine(onnx_path, out_path, *, intermediate, **_):  # stands in for TensorRT: what it was given
        built.update(onnx=onnx_path, sidecar=read_sidecar(onnx_path), intermediate=intermediate)
        out_path.write_bytes(b"engine")
        write_sidecar(out_path, built["sidecar"])  # the ONNX's, parity included: what the summary and exit code read

    monkeypatch.setattr(cli_export, "require_tensorrt", lambda: None)
    monkeypatch.setattr(cli_export, "build_engine", build_engine)
    monkeypatch.setattr(cli_export.pipeline, "record_engine_parity", lambda *a: None)
    ckpt = _checkpoint(tmp_path / "m.safetensors", 2)
    assert main(["export", "--checkpoint", str(ckpt), "--format", "trt", "--out", str(tmp_path / "vit.engine"), "--force", "--quiet"]) == 0
    assert built["intermediate"] and ".vitfast-staging" in built["onnx"].parts and not built["onnx"].exists()
    assert built["sidecar"]["source"]["checkpoint"] == str(ckpt.resolve())
    assert theirs.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "vit.engine", "vit.engine.json", "vit.onnx"]


def test_an_intermediate_onnx_is_recorded_by_hash_alone(tmp_path):
    from vitfast.export.artifacts import made_from

    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(os.urandom(100))
    kept, scratch = made_from(onnx), made_from(onnx, intermediate=True)
    assert kept == {"path": str(onnx), "sha256": kept["sha256"]} and len(kept["sha256"]) == 64
    assert scratch == {"path": None, "sha256": kept["sha256"], "kept": False}


# ---------------------------------------------------------------------------- 9: sidecars of int8 and triton-repo
def test_int8_and_triton_repo_sidecars_name_no_deleted_temporary(tmp_path):
    ckpt = _checkpoint(tmp_path / "m.safetensors", 3)
    calib = _images(tmp_path / "calib", 6, seed=3)
    assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--precision", "int8", "--calib-dir", str(calib),
                 "--calib-samples", "5", "--out", str(tmp_path / "q.onnx"), "--quiet"]) == 0  # fmt: skip
    quantized_from = read_sidecar(tmp_path / "q.onnx")["quantized_from"]
    assert quantized_from["path"] is None and not quantized_from["kept"] and len(quantized_from["sha256"]) == 64
    assert main(["export", "--checkpoint", str(ckpt), "--format", "triton-repo", "--out", str(tmp_path / "repo"), "--quiet"]) == 0
    assert json.loads((tmp_path / "repo.json").read_text())["artifact"] is None  # the ONNX it copied in was a temporary


# ---------------------------------------------------------------------------- a failed export parity
def _overflowing_checkpoint(path, seed, scale=1e6):
    """A checkpoint whose last MLP writes activations past float16's range (outlier features): its fp16 export gives inf/NaN."""
    torch.manual_seed(seed)
    model = randomize(vitfast.create_model(tiny_config(depth=1)))
    with torch.no_grad():
        model.blocks[0].mlp.fc2.weight.mul_(scale)
    return vitfast.save_checkpoint(model, path), model


def test_an_export_that_fails_parity_is_kept_exits_1_and_warns_on_load(tmp_path, capsys):
    """The fp16 export of an overflowing model was written with `passed: false` in its sidecar, exit 0 and a summary
    that said nothing: now one error line with the numbers and the way to the layer, exit 1 (--quiet too), the file
    kept with its sidecar; the Python API warns instead of raising, and loading the artifact warns once."""
    ckpt, model = _overflowing_checkpoint(tmp_path / "big.safetensors", 4)
    out = tmp_path / "big16.onnx"
    for quiet in ([], ["--quiet"]):
        assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--precision", "fp16", "--out", str(out), "--force",
                     *quiet]) == 1  # fmt: skip
        err = _one_error_line(capsys)
        assert "vitfast: warning" not in err and err.count("FAILED") == 1 + (not quiet)  # + the summary line's verdict
        assert "vitfast: error: parity FAILED: max_abs_err nan (limit " in err and f"{out} is kept for inspection" in err
        assert f"vitfast check {out} --against OTHER.onnx --mark-all" in err
        assert read_sidecar(out)["parity"]["passed"] is False
    repo = tmp_path / "repo"  # a repository of a failing export: the same, naming the graph in it
    assert main(["export", "--checkpoint", str(ckpt), "--format", "triton-repo", "--precision", "fp16", "--out", str(repo)]) == 1
    assert f"{repo / 'vit' / '1' / 'model.onnx'} is kept for inspection" in _one_error_line(capsys)
    with pytest.warns(vitfast.errors.ParityWarning, match=r"parity FAILED: max_abs_err nan .*; .*api16.onnx is kept for inspection"):
        api = vitfast.export.to_onnx(model, tmp_path / "api16.onnx", precision="fp16")
    assert read_sidecar(api)["parity"]["passed"] is False
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        vitfast.load_engine(out)
    said = [str(w.message) for w in seen if issubclass(w.category, vitfast.errors.ParityWarning)]
    assert len(said) == 1 and said[0].startswith(f"{out}: its sidecar records that its export failed the parity check")
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.errors.ParityWarning)  # a model that fits fp16 exports and loads without one
        fine = vitfast.export.to_onnx(randomize(vitfast.create_model(tiny_config(depth=1))), tmp_path / "fine.onnx", precision="fp16")
        vitfast.load_engine(fine)


def test_an_int8_export_that_fails_parity_exits_1_and_its_file_stays(tmp_path, capsys, monkeypatch):
    """int8 held to limits no quantization meets (a zero error, cosine 1): quantize_int8 warns, the CLI exits 1 with the
    error line and keeps the file. An fp32 graph that already fails against PyTorch is not quantized: int8 parity,
    measured against that graph, would pass and mean nothing."""
    ckpt = _checkpoint(tmp_path / "m.safetensors", 5)
    calib = _images(tmp_path / "calib", 8, seed=5)
    monkeypatch.setitem(vitfast.precision.TOLERANCES, "int8", {"max_rel_err": 0.0, "cosine": 1.0})
    out = tmp_path / "q.onnx"
    assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--precision", "int8", "--calib-dir", str(calib),
                 "--calib-samples", "6", "--out", str(out), "--quiet"]) == 1  # fmt: skip
    assert "vitfast: error: parity FAILED: max_abs_err " in _one_error_line(capsys)
    assert read_sidecar(out)["parity"]["passed"] is False and read_sidecar(out)["precision"] == "int8"
    fp32 = vitfast.export.to_onnx(vitfast.load_checkpoint(ckpt), tmp_path / "m.onnx")
    with pytest.warns(vitfast.errors.ParityWarning, match=r"parity FAILED: .*api.int8.onnx is kept for inspection"):
        vitfast.export.quantize_int8(fp32, tmp_path / "api.int8.onnx", calib, samples=6)
    overflowing, _ = _overflowing_checkpoint(tmp_path / "inf.safetensors", 5, scale=1e37)  # float32 overflows too
    before = set(tmp_path.iterdir())
    assert main(["export", "--checkpoint", str(overflowing), "--format", "onnx", "--precision", "int8", "--calib-dir", str(calib),
                 "--out", str(tmp_path / "inf.int8.onnx"), "--quiet"]) == 2  # fmt: skip
    assert "the fp32 ONNX graph that int8 quantizes disagrees with PyTorch (parity FAILED: max_abs_err nan" in _one_error_line(capsys)
    assert set(tmp_path.iterdir()) == before


# ---------------------------------------------------------------------------- --force and external weights
def test_force_removes_the_old_exports_external_weights_and_no_other_file(tmp_path, monkeypatch):
    """A graph exported with its weights in PATH.data (over protobuf's 2 GiB: the limit lowered here), then exported
    again inline with --force, left the old PATH.data beside it (a Triton repository then copied and recorded it). The
    old sidecar recorded it as its external data: it goes. A PATH.data that no sidecar recorded is someone's: it stays."""
    from vitfast.export import onnx_export

    torch.manual_seed(6)
    model = randomize(vitfast.create_model(tiny_config(depth=1)))
    out = tmp_path / "m.onnx"
    with monkeypatch.context() as patch:
        patch.setattr(onnx_export, "_needs_external_data", lambda model: True)
        vitfast.export.to_onnx(model, out)
    assert [(f["role"], f["name"]) for f in read_sidecar(out)["files"]] == [("artifact", "m.onnx"), ("external-data", "m.onnx.data")]
    vitfast.export.to_onnx(model, out, force=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.json"]
    theirs = os.urandom(64)
    (tmp_path / "m.onnx.data").write_bytes(theirs)
    vitfast.export.to_onnx(model, out, force=True)
    assert (tmp_path / "m.onnx.data").read_bytes() == theirs and [f["name"] for f in read_sidecar(out)["files"]] == ["m.onnx"]


# ---------------------------------------------------------------------------- 3: a changed checkpoint
def test_check_refuses_a_checkpoint_changed_since_export_and_names_the_fix(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "m.safetensors", 4)
    assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--out", str(tmp_path / "m.onnx"), "--quiet"]) == 0
    _checkpoint(ckpt, 5)  # other weights under the same name
    assert main(["check", str(tmp_path / "m.onnx"), "--json"]) == 2
    err = _one_error_line(capsys)
    assert f"{ckpt.resolve()} has changed since the artifact was exported from it" in err and f"pass --checkpoint {ckpt.resolve()}" in err
    assert main(["check", str(tmp_path / "m.onnx"), "--checkpoint", str(ckpt), "--json"]) == 1  # compared as asked: other weights
    assert not json.loads(capsys.readouterr().out)["passed"]
    ckpt.unlink()
    assert main(["check", str(tmp_path / "m.onnx")]) == 2
    assert f"exported from {ckpt.resolve()}, which is gone; pass --checkpoint PATH" in _one_error_line(capsys)


def test_check_refuses_a_model_folder_whose_weights_or_preprocessing_changed_since_export(tmp_path, capsys):
    """A Hugging Face folder is recorded by the sha256 of the files its loading reads: new weights, or a
    preprocessor_config.json added, are refused as a changed checkpoint (not blamed on the export); a README is not read."""
    transformers = pytest.importorskip("transformers")

    def save(seed):
        torch.manual_seed(seed)
        config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, num_labels=10)  # fmt: skip
        transformers.ViTForImageClassification(config).eval().save_pretrained(folder)

    folder, onnx = tmp_path / "hf", str(tmp_path / "m.onnx")
    save(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the preprocessing guessed without a preprocessor_config.json
        assert main(["export", "--checkpoint", str(folder), "--format", "onnx", "--out", onnx, "--quiet"]) == 0
    (folder / "README.md").write_text("notes")
    assert main(["check", onnx, "--json", "--quiet"]) == 0 and json.loads(capsys.readouterr().out)["passed"]
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "ViTImageProcessor", "image_mean": [0.4] * 3}))
    assert main(["check", onnx, "--quiet"]) == 2
    assert f"{folder.resolve()} has changed since the artifact was exported from it" in _one_error_line(capsys)
    (folder / "preprocessor_config.json").unlink()
    save(1)
    assert main(["check", onnx, "--quiet"]) == 2
    assert f"{folder.resolve()} has changed since the artifact was exported from it" in _one_error_line(capsys)
    sidecar = tmp_path / "m.onnx.json"  # an older vitfast recorded no sha256 for a folder: checked against it as it is
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps(meta | {"source": meta["source"] | {"sha256": None}}))
    assert main(["check", onnx, "--json", "--quiet"]) == 1 and not json.loads(capsys.readouterr().out)["passed"]


# ---------------------------------------------------------------------------- 4: --samples N compares N
def test_check_compares_every_sample_in_chunks_the_profile_takes(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "m.safetensors", 6)
    for name in ("a", "b"):
        assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--batch", "1:1:2", "--out", str(tmp_path / f"{name}.onnx"),
                     "--quiet"]) == 0  # fmt: skip
    assert main(["check", str(tmp_path / "a.onnx"), "--samples", "7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 7
    assert main(["check", str(tmp_path / "a.onnx"), "--against", str(tmp_path / "b.onnx"), "--samples", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 5
    data = _images(tmp_path / "data", 5, seed=6)
    assert main(["check", str(tmp_path / "a.onnx"), "--data", str(data), "--samples", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 5  # all the folder has


# ---------------------------------------------------------------------------- 5: ambiguous class folders
def test_eval_refuses_folders_named_after_a_label_the_model_has_twice(tmp_path, capsys):
    labels = ("crane", "bee", "cat", "dog", "crane", "fox", "gnu")  # as ImageNet's 134 and 517
    ckpt = _checkpoint(tmp_path / "m.safetensors", 7, labels=labels)
    for name in ("crane", "bee"):
        _images(tmp_path / "data" / name, 2, seed=len(name))
    assert main(["eval", str(ckpt), "--data", str(tmp_path / "data")]) == 2
    err = _one_error_line(capsys)
    assert "name labels the model has more than once: crane (0, 4)" in err and "pass --labels FILE with one distinct name" in err
    (tmp_path / "labels.txt").write_text("\n".join(("crane bird", "bee", "cat", "dog", "crane", "fox", "gnu")))
    assert main(["eval", str(ckpt), "--data", str(tmp_path / "data"), "--labels", str(tmp_path / "labels.txt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 4


# ---------------------------------------------------------------------------- 6: --config's guesses
def test_config_file_guesses_are_printed_and_recorded(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "m.safetensors", 8)
    mean = np.random.default_rng(8).uniform(0.3, 0.6, 3).round(3).tolist()
    (tmp_path / "pre.json").write_text(json.dumps({"image_processor_type": "ViTImageProcessor", "resample": 1,  # LANCZOS
                                                   "size": {"height": 32, "width": 32}, "image_mean": mean, "image_std": [0.25] * 3}))  # fmt: skip
    base = ["export", "--checkpoint", str(ckpt), "--config", str(tmp_path / "pre.json"), "--format", "onnx", "--quiet"]
    assert main([*base, "--out", str(tmp_path / "a.onnx")]) == 0
    said = "guessed interpolation: the processor's resample 1 is not supported"
    assert said in capsys.readouterr().err
    source = read_sidecar(tmp_path / "a.onnx")["source"]
    assert "resample 1 is not supported" in source["guessed"]["interpolation"] and source["overrides"]["mean"] == pytest.approx(mean)
    _images(tmp_path / "img", 1, seed=8)
    assert main(["predict", str(ckpt), str(tmp_path / "img"), "--config", str(tmp_path / "pre.json"), "--json"]) == 0
    assert said in capsys.readouterr().err
    assert main([*base, "--interpolation", "bilinear", "--out", str(tmp_path / "b.onnx")]) == 0  # stated by a flag: no guess
    assert said not in capsys.readouterr().err and read_sidecar(tmp_path / "b.onnx")["source"]["guessed"] == {}


# ---------------------------------------------------------------------------- 7: inspect --model
def test_inspect_model_applies_the_flags_and_the_exports_seed(tmp_path, capsys):
    _images(tmp_path / "img", 1, seed=9)
    runs = []
    for i in range(2):
        assert main(["inspect", "--model", "vit_cifar_patch4_32", "--num-heads", "2", "--image", str(tmp_path / "img" / "0.png"),
                     "--out", str(tmp_path / f"figs{i}"), "--json"]) == 0  # fmt: skip
        runs.append(json.loads(capsys.readouterr().out))
    assert len(runs[0]["head_attention"]) == 2  # the flag's, not the registered model's 4
    assert runs[0]["rollout"] == runs[1]["rollout"] and runs[0]["head_attention"] == runs[1]["head_attention"]


# ---------------------------------------------------------------------------- 8: numeric flags
@pytest.mark.parametrize("flag, value", [("--atol", "-1"), ("--rtol", "nan"), ("--atol", "inf"), ("--img-size", "0")])
def test_check_refuses_negative_or_non_finite_tolerances_and_a_zero_image_size(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exited:
        main(["check", str(tmp_path / "m.onnx"), flag, value])
    assert exited.value.code == 2 and f"argument {flag}: must be" in capsys.readouterr().err


# ---------------------------------------------------------------------------- a training checkpoint's two sets of weights
def test_export_no_ema_takes_the_trained_weights_and_check_rebuilds_the_same(tmp_path, capsys):
    """timm's train.py checkpoint: the EMA by default, as timm loads it, said once; `--no-ema` the trained weights,
    recorded in the sidecar so that `check` compares with the same ones (it would fail against the EMA)."""
    cfg = tiny_config()
    torch.manual_seed(0)
    trained, ema = (randomize(vitfast.create_model(cfg)).state_dict() for _ in range(2))
    ckpt = tmp_path / "checkpoint-3.pth.tar"
    torch.save({"epoch": 3, "state_dict": trained, "state_dict_ema": ema}, ckpt)
    heads = ["--num-heads", str(cfg.num_heads)]
    for flag, weights in (([], ema), (["--no-ema"], trained)):
        out = tmp_path / f"m{len(flag)}.onnx"
        assert main(["export", "--checkpoint", str(ckpt), *heads, "--format", "onnx", "--out", str(out), *flag, "--quiet"]) == 0
        err = capsys.readouterr().err
        assert ("the EMA loaded" in err) != bool(flag)
        assert read_sidecar(out)["source"]["use_ema"] is not bool(flag)
        assert main(["check", str(out), "--json"]) == 0
        assert ("the EMA loaded" in capsys.readouterr().err) != bool(flag)  # check rebuilt the same weights, said the same
        reference = vitfast.load_checkpoint(ckpt, config=cfg, use_ema=not flag)
        assert all(torch.equal(reference.state_dict()[k], v) for k, v in weights.items())
        capsys.readouterr()  # that load's own note
    note = vitfast.checkpoint.describe_guesses(ckpt, cfg, {"weights": "the EMA loaded"})  # alone: no config flags offered
    assert note == f"{ckpt}: weights (the EMA loaded)"
    capsys.readouterr()
    assert main(["export", "--model", "vit_cifar_patch4_32", "--no-ema", "--format", "onnx", "--out", str(tmp_path / "r.onnx")]) == 2
    assert "--no-ema picks a training checkpoint's weights: it goes with --checkpoint" in _one_error_line(capsys)
