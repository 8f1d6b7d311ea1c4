"""`vitfast export --format triton-repo`: the numpy preprocessing against `vitfast.preprocess`, the
generated config.pbtxt files parsed by Triton's own ModelConfig protobuf, the repository layout,
and the repository loaded into a real Triton server (PyTriton's, which has only the python backend)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import PIL
import pytest
import torch

pytest.importorskip("onnxruntime", reason="repository tests export ONNX: pip install 'vitfast[export]'")

import vitfast  # noqa: E402
from serve_helpers import free_ports, require_triton, wait_ready  # noqa: E402
from vitfast.errors import ArtifactError  # noqa: E402
from vitfast.export import read_sidecar, to_onnx  # noqa: E402
from vitfast.export.artifacts import write_sidecar  # noqa: E402
from vitfast.export.triton_preprocess import PreprocessSpec, preprocess_batch  # noqa: E402
from vitfast.export.triton_repo import PREPROCESS_SOURCE, Enum, to_pbtxt, triton_repository  # noqa: E402

VITFAST = Path(sys.executable).parent / "vitfast"
PILLOW = tuple(int(p) for p in PIL.__version__.split(".")[:2])
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def pb():
    """Triton's own model_config.proto definitions (tritonclient ships them)."""
    return pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="config tests need tritonclient[grpc]: pip install 'vitfast[serve]'")


def model_config(text: str):
    """Parse config.pbtxt text into Triton's ModelConfig protobuf: unknown fields or bad values fail."""
    from google.protobuf import text_format

    return text_format.Parse(text, pb().ModelConfig())


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    """(model, path) of vit_cifar_patch4_32 (with class names) exported with batch profile 1:4:8."""
    torch.manual_seed(0)
    model = vitfast.create_model("vit_cifar_patch4_32", labels=LABELS)
    return model, to_onnx(model, tmp_path_factory.mktemp("onnx") / "cifar.onnx", batch=(1, 4, 8))


@pytest.fixture(scope="module")
def repo(onnx_model, tmp_path_factory):
    return triton_repository(onnx_model[1], tmp_path_factory.mktemp("repo") / "models", instance_count=2, max_queue_delay_us=250)


# ---------------------------------------------------------------------------- preprocessing (numpy only)
def spec_for(config: vitfast.ViTConfig) -> PreprocessSpec:
    return PreprocessSpec.from_config(config)


@pytest.mark.skipif(PILLOW < (13, 0), reason="the numpy port follows Pillow >= 13 (which pass runs first changed in 13.0)")
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear", "nearest"])
@pytest.mark.parametrize("crop_pct", [1.0, 0.875, 0.9])
@pytest.mark.parametrize("img_size", [32, 224, (24, 40)])
def test_numpy_preprocessing_equals_vitfast_preprocess_exactly(interpolation, crop_pct, img_size):
    """Bit-identical to PIL through vitfast.preprocess: upscales, downscales, both pass orders,
    tall and wide images, the exact-size shortcut, one and three channels."""
    rng = np.random.default_rng(0)
    sizes = [(32, 32), (224, 224), (17, 300), (300, 17), (97, 131), (480, 640), (256, 40), (3, 5)]
    for channels in (3, 1):
        config = vitfast.ViTConfig(img_size=img_size, patch_size=8, embed_dim=16, depth=1, num_heads=1, num_classes=2,
                                   in_chans=channels, crop_pct=crop_pct, interpolation=interpolation)  # fmt: skip
        for h, w in sizes:
            images = rng.integers(0, 256, (2, h, w, channels), dtype=np.uint8)
            images[1] = (np.arange(w)[None, :, None] * 37 + np.arange(h)[:, None, None] * 11) % 256  # smooth ramps
            ours = preprocess_batch(images, spec_for(config))
            assert ours.dtype == np.float32 and ours.flags.c_contiguous
            np.testing.assert_array_equal(ours, vitfast.preprocess(images, config).numpy(), err_msg=f"{h}x{w}x{channels}")


@pytest.mark.skipif(PILLOW < (13, 0), reason="the numpy port follows Pillow >= 13 (which pass runs first changed in 13.0)")
@pytest.mark.parametrize("crop_mode, crop_rounding", [("squash", "round"), ("center", "floor"), ("squash", "floor"), ("border", "round")])
@pytest.mark.parametrize("img_size", [32, (24, 40)])
def test_numpy_preprocessing_follows_crop_mode_and_rounding(crop_mode, crop_rounding, img_size):
    """Hugging Face's squash resize, floored crop offsets and timm's border padding, bit-identical too (odd margins included)."""
    rng = np.random.default_rng(1)
    config = vitfast.ViTConfig(img_size=img_size, patch_size=8, embed_dim=16, depth=1, num_heads=1, num_classes=2,
                               crop_pct=0.875, interpolation="bilinear", crop_mode=crop_mode, crop_rounding=crop_rounding)  # fmt: skip
    for h, w in [(17, 300), (97, 131), (480, 640), (3, 5), (45, 37)]:
        images = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
        ours = preprocess_batch(images, spec_for(config))
        np.testing.assert_array_equal(ours, vitfast.preprocess(images, config).numpy(), err_msg=f"{h}x{w}")


@pytest.mark.parametrize(
    "images, message",
    [
        (np.zeros((1, 8, 8, 3), np.float32), "must be uint8"),
        (np.zeros((1, 8, 8, 4), np.uint8), "[H, W, 3]"),
        (np.zeros((1, 0, 8, 3), np.uint8), "no pixels"),
        (np.zeros((0, 8, 8, 3), np.uint8), "empty batch"),
        (np.zeros((8, 8, 3), np.uint8), "batch of uint8 images"),
    ],
)
def test_numpy_preprocessing_rejects_bad_images(images, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        preprocess_batch(images, spec_for(vitfast.get_config("vit_cifar_patch4_32")))


def test_preprocess_spec_survives_config_parameters():
    config = vitfast.get_config("vit_cifar_patch4_32")
    spec = PreprocessSpec.from_parameters(spec_for(config).to_parameters())
    assert (spec.img_size, spec.in_chans, spec.crop_pct, spec.interpolation) == (config.img_hw, 3, 1.0, "bicubic")
    assert spec.mean == tuple(config.mean) and spec.std == tuple(config.std)  # floats written with full precision


@pytest.mark.skipif(PILLOW < (13, 0), reason="the numpy port follows Pillow >= 13 (which pass runs first changed in 13.0)")
@pytest.mark.parametrize("crop_mode", ["center", "border"])
def test_numpy_preprocessing_of_2_and_4_channels_equals_vitfast_preprocess(crop_mode, tmp_path):
    """Models of any channel count get a repository whose preprocessing is `vitfast.preprocess`'s, bit for bit."""
    rng = np.random.default_rng(2)
    for channels in (2, 4):
        config = vitfast.ViTConfig(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=1, num_classes=2, in_chans=channels,
                                   mean=(0.25,) * channels, std=(0.5,) * channels, crop_pct=0.875, crop_mode=crop_mode)  # fmt: skip
        for h, w in [(45, 61), (300, 17), (3, 5)]:
            images = rng.integers(0, 256, (2, h, w, channels), dtype=np.uint8)
            np.testing.assert_array_equal(preprocess_batch(images, spec_for(config)), vitfast.preprocess(images, config).numpy(),
                                          err_msg=f"{h}x{w}x{channels}")  # fmt: skip
    repo = triton_repository(to_onnx(vitfast.create_model(config), tmp_path / "c4.onnx", batch=(1, 2, 4)), tmp_path / "repo")
    assert model_config((repo / "vit_uint8/config.pbtxt").read_text()).input[0].dims == [-1, -1, 4]


# ---------------------------------------------------------------------------- repository
def test_repository_layout_and_sidecars(repo, onnx_model):
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*"))
    assert files == [
        "vit", "vit/1", "vit/1/model.onnx", "vit/1/model.onnx.json", "vit/config.pbtxt", "vit/labels.txt",
        "vit_preprocess", "vit_preprocess/1", "vit_preprocess/1/model.py", "vit_preprocess/config.pbtxt",
        "vit_uint8", "vit_uint8/1", "vit_uint8/config.pbtxt", "vit_uint8/labels.txt",
    ]  # fmt: skip
    for model in ("vit", "vit_uint8"):
        assert (repo / model / "labels.txt").read_text().splitlines() == LABELS
    assert (repo / "vit_preprocess/1/model.py").read_text() == PREPROCESS_SOURCE.read_text()
    side = json.loads(Path(str(repo) + ".json").read_text())
    assert side["kind"] == "triton-repository" and side["platform"] == "onnxruntime_onnx" and side["max_batch_size"] == 8
    assert side["models"] == {"model": "vit", "preprocess": "vit_preprocess", "ensemble": "vit_uint8"}
    assert side["config"] == read_sidecar(onnx_model[1])["config"]
    copied = vitfast.load_engine(repo / "vit/1/model.onnx")  # the copy runs and still has its sidecar
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(copied(x), vitfast.load_engine(onnx_model[1])(x), rtol=0, atol=0)


def test_every_config_parses_as_triton_model_config(repo):
    model = model_config((repo / "vit/config.pbtxt").read_text())
    assert (model.name, model.platform, model.max_batch_size) == ("vit", "onnxruntime_onnx", 8)
    assert [(t.name, t.data_type, list(t.dims)) for t in model.input] == [("images", pb().TYPE_FP32, [3, 32, 32])]
    assert [(t.name, t.data_type, list(t.dims)) for t in model.output] == [("logits", pb().TYPE_FP32, [10])]
    assert model.dynamic_batching.max_queue_delay_microseconds == 250
    assert [(g.count, g.kind) for g in model.instance_group] == [(2, pb().ModelInstanceGroup.KIND_AUTO)]
    assert model.output[0].label_filename == "labels.txt"
    warmups = [(w.batch_size, {k: (v.data_type, list(v.dims), v.random_data) for k, v in w.inputs.items()}) for w in model.model_warmup]
    assert warmups == [(b, {"images": (pb().TYPE_FP32, [3, 32, 32], True)}) for b in (1, 8)]

    pre = model_config((repo / "vit_preprocess/config.pbtxt").read_text())
    assert (pre.backend, pre.max_batch_size) == ("python", 8)
    assert [(t.name, t.data_type, list(t.dims)) for t in pre.input] == [("images", pb().TYPE_UINT8, [-1, -1, 3])]
    assert [(t.name, t.data_type, list(t.dims)) for t in pre.output] == [("pixels", pb().TYPE_FP32, [3, 32, 32])]
    assert [(g.count, g.kind) for g in pre.instance_group] == [(2, pb().ModelInstanceGroup.KIND_CPU)]
    params = {k: v.string_value for k, v in pre.parameters.items()}
    assert PreprocessSpec.from_parameters(params).to_parameters() == params

    ens = model_config((repo / "vit_uint8/config.pbtxt").read_text())
    assert (ens.platform, ens.max_batch_size) == ("ensemble", 8)
    assert [t.name for t in ens.input] == ["images"] and [t.name for t in ens.output] == ["logits"]
    assert ens.output[0].label_filename == "labels.txt"
    steps = ens.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["vit_preprocess", "vit"]
    assert dict(steps[0].input_map) == {"images": "images"} and dict(steps[0].output_map) == {"pixels": "pixels"}
    assert dict(steps[1].input_map) == {"images": "pixels"} and dict(steps[1].output_map) == {"logits": "logits"}


def test_tensorrt_plan_gets_a_tensorrt_config_and_its_profile_is_respected(onnx_model, tmp_path):
    """A .plan artifact (bytes are only copied; its sidecar has the profile) -> tensorrt_plan on KIND_GPU."""
    meta = read_sidecar(onnx_model[1]) | {"kind": "tensorrt", "tensorrt": {"version": "10.7.0.23"}}
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"serialized engine")
    write_sidecar(plan, meta)
    repo = triton_repository(plan, tmp_path / "repo", name="cifar")
    text = (repo / "cifar/config.pbtxt").read_text()
    assert text.startswith("# model.plan loads only in a Triton release whose bundled TensorRT is 10.7.0.23")  # a plan's one requirement
    config = model_config(text)
    assert (config.platform, config.max_batch_size) == ("tensorrt_plan", 8)
    assert config.instance_group[0].kind == pb().ModelInstanceGroup.KIND_GPU
    assert (repo / "cifar/1/model.plan").read_bytes() == b"serialized engine"
    assert [s.model_name for s in model_config((repo / "cifar_uint8/config.pbtxt").read_text()).ensemble_scheduling.step] == [
        "cifar_preprocess", "cifar"]  # fmt: skip
    with pytest.raises(ArtifactError, match="exceeds this engine's profile maximum 8"):
        triton_repository(plan, tmp_path / "big", max_batch_size=16)
    write_sidecar(plan, meta | {"input": meta["input"] | {"batch": [2, 4, 8]}})
    with pytest.raises(ArtifactError, match="starts at 2; Triton needs 1"):
        triton_repository(plan, tmp_path / "min")
    assert not (tmp_path / "big").exists() and not (tmp_path / "min").exists()


def test_a_repository_given_as_a_model_names_the_model_file_in_it_and_tritonserver(repo, tmp_path):
    """`vitfast serve REPO` (or check, predict, info): the repository is no model; the error names the file vitfast runs."""
    with pytest.raises(vitfast.errors.CheckpointError) as info:
        vitfast.load_engine(repo)
    assert str(info.value) == (f"{repo} is a Triton model repository (a folder per model with its config.pbtxt), not a model: give "
                               f"vitfast the model file in it, {repo}/vit/1/model.onnx; or run the whole repository with: "
                               f"tritonserver --model-repository {repo}")  # fmt: skip
    served = subprocess.run([str(VITFAST), "serve", str(repo)], capture_output=True, text=True, timeout=300)
    assert served.returncode == 2 and served.stderr == f"vitfast: error: {info.value}\n"
    bare = tmp_path / "bare"
    shutil.copytree(repo / "vit_preprocess", bare / "vit_preprocess")  # a repository with no ONNX or TensorRT model
    with pytest.raises(vitfast.errors.CheckpointError, match="takes a model file .*, and it holds none; or run the whole repository"):
        vitfast.load_engine(bare)


def test_an_engine_from_another_tools_graph_keeps_its_names_and_the_ensemble_maps_them(onnx_model, tmp_path):
    """Triton binds a TensorRT model's tensors by the engine's names (another tool's graph's: pixel_values, pooler_output),
    so `vit` keeps them; `vit_uint8` still takes `images` and returns `logits`, as `serve`'s does. A stand-in .plan whose
    sidecar has the names `export --onnx optimum/model.onnx --format trt` records; in the real server `vit` runs the ONNX."""
    meta = read_sidecar(onnx_model[1]) | {"kind": "tensorrt"}
    meta["input"] = meta["input"] | {"name": "pixel_values"}
    meta["output"] = meta["output"] | {"name": "pooler_output"}
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"serialized engine")
    write_sidecar(plan, meta)
    repo = triton_repository(plan, tmp_path / "repo")
    net = model_config((repo / "vit/config.pbtxt").read_text())
    assert [t.name for t in net.input] == ["pixel_values"] and [t.name for t in net.output] == ["pooler_output"]
    assert set(net.model_warmup[0].inputs) == {"pixel_values"}
    ens = model_config((repo / "vit_uint8/config.pbtxt").read_text())
    assert [t.name for t in ens.input] == ["images"] and [t.name for t in ens.output] == ["logits"]
    assert ens.output[0].label_filename == "labels.txt"
    steps = ens.ensemble_scheduling.step
    assert dict(steps[1].input_map) == {"pixel_values": "pixels"} and dict(steps[1].output_map) == {"pooler_output": "logits"}
    with real_server(repo, tmp_path, onnx=onnx_model[1]) as (infer, _):
        images = np.random.default_rng(3).integers(0, 256, (2, 45, 61, 3), dtype=np.uint8)
        np.testing.assert_allclose(infer("vit_uint8", images, "logits"), vitfast.load_engine(onnx_model[1])(images).numpy(), rtol=1e-5, atol=1e-5)


def test_existing_output_needs_force_and_failures_leave_nothing(onnx_model, tmp_path):
    out = triton_repository(onnx_model[1], tmp_path / "repo", name="a")
    with pytest.raises(ArtifactError, match="already exists; pass --force"):
        triton_repository(onnx_model[1], out, name="b")
    triton_repository(onnx_model[1], out, name="b", force=True)
    assert sorted(p.name for p in out.iterdir()) == ["b", "b_preprocess", "b_uint8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo", "repo.json"]  # no staging folders left
    for bad, message in [("model.safetensors", "not an ONNX file or TensorRT engine"), ("missing.onnx", "no such artifact")]:
        (tmp_path / "model.safetensors").write_bytes(b"x")
        with pytest.raises(ArtifactError, match=message):
            triton_repository(tmp_path / bad, tmp_path / "other")
    with pytest.raises(ArtifactError, match="not valid for Triton"):
        triton_repository(onnx_model[1], tmp_path / "other", name="my model")
    assert not (tmp_path / "other").exists()


def test_force_refuses_a_repository_with_files_vitfast_did_not_write_or_changed(onnx_model, tmp_path):
    """The sidecar records every file's sha256: a version folder or an edit added since is named and kept, not deleted."""
    out = triton_repository(onnx_model[1], tmp_path / "vr")
    recorded = json.loads(Path(str(out) + ".json").read_text())["contents"]
    assert recorded["vit/config.pbtxt"] == vitfast.export.artifacts.sha256_file(out / "vit/config.pbtxt") and recorded["vit_uint8/1/"] is None
    (out / "vit/2").mkdir()
    shutil.copyfile(out / "vit/1/model.onnx", out / "vit/2/model.onnx")
    with open(out / "vit/config.pbtxt", "a") as config:
        config.write("# tuned by ops\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ArtifactError, match=r"vr holds files vitfast did not write \(vit/2/, vit/2/model.onnx\) and files changed since "
                                            r"vitfast wrote them \(vit/config.pbtxt\), so --force will not replace it"):  # fmt: skip
        triton_repository(onnx_model[1], out, force=True)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    shutil.rmtree(out / "vit/2")
    (out / "vit/config.pbtxt").write_text(before[out / "vit/config.pbtxt"].decode().replace("# tuned by ops\n", ""))
    triton_repository(onnx_model[1], out, force=True)  # as vitfast wrote it again: replaced
    side = Path(str(out) + ".json")
    side.write_text(json.dumps({k: v for k, v in json.loads(side.read_text()).items() if k != "contents"}))  # an older vitfast's
    with pytest.raises(ArtifactError, match="an older vitfast wrote.*records no sha256 of its files"):
        triton_repository(onnx_model[1], out, force=True)


def test_force_never_replaces_another_tools_file_where_the_repositorys_sidecar_goes(tmp_path):
    from vitfast.export.triton_repo import check_repository_free

    notes = tmp_path / "repo.json"
    notes.write_text('{"my": "notes"}')
    with pytest.raises(ArtifactError, match="repo.json already exists; pass --force"):
        check_repository_free(tmp_path / "repo", force=False)
    with pytest.raises(ArtifactError, match="repo.json is not a vitfast sidecar, so --force will not replace it"):
        check_repository_free(tmp_path / "repo", force=True)
    notes.write_text(json.dumps({"kind": "triton-repository", "contents": {}}))  # a repository vitfast wrote, since deleted
    assert check_repository_free(tmp_path / "repo", force=True) == tmp_path / "repo"


def test_a_killed_writes_staging_folder_in_the_repository_is_removed_by_the_next_check_unless_its_writer_lives(onnx_model, tmp_path):
    """A write into an existing folder (a mount point, or --force) is staged in OUT/.vitfast-staging/; a run killed there
    leaves it, and tritonserver, which takes every subfolder for a model, refuses to start ("failed to load model
    '.vitfast-staging'"). The next check of the repository removes it, saying so, once no live process holds its lock."""
    import fcntl
    import warnings

    from vitfast.atomic import STAGING
    from vitfast.errors import VitfastWarning
    from vitfast.export.triton_repo import check_repository_free

    out = triton_repository(onnx_model[1], tmp_path / "repo")
    models = sorted(p.name for p in out.iterdir())

    def leave_work_folder(name: str) -> Path:  # what a killed run leaves: its work folder, with its (free) lock
        work = out / STAGING / f"repo.{name}.work"
        (work / "out/repo/vit/1").mkdir(parents=True)
        (work / "lock").touch()
        return work

    live = open(leave_work_folder("live") / "lock")  # noqa: SIM115 - held as a running writer holds it
    fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)
    dead = leave_work_folder("dead")
    with warnings.catch_warnings():
        warnings.simplefilter("error", VitfastWarning)
        check_repository_free(out, force=True)
    assert sorted(p.name for p in (out / STAGING).iterdir()) == ["repo.live.work"] and not dead.exists()
    live.close()  # its writer is killed now
    leave_work_folder("dead")
    with pytest.warns(VitfastWarning, match=f"^removed {out / STAGING}, which a vitfast run killed while writing {out} left there$"):
        with pytest.raises(ArtifactError, match="already exists; pass --force"):
            triton_repository(onnx_model[1], out)
    assert sorted(p.name for p in out.iterdir()) == models  # what tritonserver loads
    leave_work_folder("dead")
    with pytest.warns(VitfastWarning, match="^removed .*, which a vitfast run killed while writing"):
        triton_repository(onnx_model[1], out, force=True)
    assert sorted(p.name for p in out.iterdir()) == models and sorted(p.name for p in tmp_path.iterdir()) == ["repo", "repo.json"]


def test_an_empty_folder_is_filled_in_place_and_never_renamed(onnx_model, tmp_path, monkeypatch):
    """An empty --out (a Docker / Kubernetes volume's mount point, which cannot be renamed: simulated) takes the
    repository without --force, staged inside it; --force then replaces a repository there in place too."""
    import os

    out = tmp_path / "models"
    out.mkdir()
    inode = out.stat().st_ino
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def refuse_the_mount_point(src, dst, *args, real=real, **kwargs):
            if out in (Path(src), Path(dst)):
                raise OSError(16, "Device or resource busy", str(src))
            assert out in Path(src).parents or out not in Path(dst).parents, (src, dst)  # staged on the folder's filesystem
            return real(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, name, refuse_the_mount_point)
    triton_repository(onnx_model[1], out)
    triton_repository(onnx_model[1], out, name="b", force=True)
    assert out.stat().st_ino == inode and sorted(p.name for p in out.iterdir()) == ["b", "b_preprocess", "b_uint8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "models.json"]
    assert read_sidecar(out / "b/1/model.onnx")["config"] == read_sidecar(onnx_model[1])["config"]


def test_the_repository_copies_the_files_the_artifacts_sidecar_records_and_no_other(onnx_model, tmp_path, monkeypatch):
    """External weights (recorded in the sidecar) go along under their own name; a `.data` file beside an inline graph
    (stale, or someone's) was copied in and recorded as the graph's weights: it is not the graph's, and stays out."""
    import os

    from vitfast.export import onnx_export

    model = onnx_model[0]
    with monkeypatch.context() as patch:
        patch.setattr(onnx_export, "_needs_external_data", lambda model: True)  # as a graph over protobuf's 2 GiB
        external = to_onnx(model, tmp_path / "ext.onnx")
    inline = to_onnx(model, tmp_path / "inline.onnx")
    (tmp_path / "inline.onnx.data").write_bytes(os.urandom(64))
    x = vitfast.data.random_images(model.config, 2, seed=7)
    for artifact, files in ((external, ["model.onnx", "ext.onnx.data"]), (inline, ["model.onnx"])):
        folder = triton_repository(artifact, tmp_path / f"repo-{artifact.stem}") / "vit" / "1"
        assert sorted(os.listdir(folder)) == sorted([*files, "model.onnx.json"])
        assert [f["name"] for f in read_sidecar(folder / "model.onnx")["files"]] == files
        with torch.no_grad():
            assert torch.allclose(vitfast.load_engine(folder / "model.onnx")(x), model(x), atol=1e-4)


def test_pbtxt_writer_escapes_strings_and_writes_enums_bare():
    message = {"name": 'a"b\\c', "input": [{"data_type": Enum("TYPE_FP32"), "dims": [-1, 3]}], "dynamic_batching": {"max_queue_delay_microseconds": 7}}
    text = to_pbtxt(message)
    assert text.startswith('name: "a\\"b\\\\c"\ninput {\n  data_type: TYPE_FP32\n  dims: [ -1, 3 ]\n}\n')
    parsed = model_config(text)
    assert (parsed.name, parsed.input[0].data_type, parsed.dynamic_batching.max_queue_delay_microseconds) == ('a"b\\c', pb().TYPE_FP32, 7)


def test_cli_export_triton_repo(tmp_path):
    """The CLI exports the model to ONNX at --precision and writes the repository with --batch's maximum."""
    run = lambda *a: subprocess.run([str(VITFAST), *map(str, a)], capture_output=True, text=True, timeout=600)  # noqa: E731
    args = ["export", "--model", "vit_cifar_patch4_32", "--format", "triton-repo", "--batch", "1:2:6", "--out", tmp_path / "repo"]
    first = run(*args)
    assert first.returncode == 0, first.stderr
    assert "tritonserver --model-repository" in first.stderr
    assert model_config((tmp_path / "repo/vit/config.pbtxt").read_text()).max_batch_size == 6
    again = run(*args)
    assert again.returncode == 2 and "--force" in again.stderr and again.stderr.strip().count("\n") == 0
    fp16 = run(*args[:-2], "--precision", "fp16", "--out", tmp_path / "repo", "--force")
    assert fp16.returncode == 0, fp16.stderr
    assert read_sidecar(tmp_path / "repo/vit/1/model.onnx")["precision"] == "fp16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo", "repo.json"]


# ---------------------------------------------------------------------------- the real server
# PyTriton's tritonserver has only the python backend, so the network model is swapped for a
# python-backend model running the same model.onnx with ONNX Runtime; the preprocessing model
# and the ensemble are loaded exactly as generated. It takes and returns the tensors its config names.
ONNX_AS_PYTHON = '''
import json
import os
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        config = json.loads(args["model_config"])
        self.input, self.output = config["input"][0]["name"], config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy()
            (logits,) = self.session.run(None, {self.session.get_inputs()[0].name: images})
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output, logits)]))
        return responses
'''


@contextlib.contextmanager
def real_server(repo: Path, tmp_path: Path, onnx: Path | None = None):
    """The generated repository in PyTriton's tritonserver, the network model swapped for ONNX_AS_PYTHON (running `onnx`,
    for a repository of a stand-in engine); yields `infer(model, images, output)` (HTTP, uint8 or float32 images) and the client."""
    require_triton()
    import tritonclient.http as httpclient
    from google.protobuf import text_format
    from pytriton.triton import Triton, TritonConfig

    from vitfast.serve import interpreter_library_path

    served = shutil.copytree(repo, tmp_path / "served")
    config = model_config((served / "vit/config.pbtxt").read_text())
    config.platform, config.backend = "", "python"
    config.instance_group[0].kind = config.instance_group[0].KIND_CPU
    (served / "vit/config.pbtxt").write_text(text_format.MessageToString(config))
    (served / "vit/1/model.py").write_text(ONNX_AS_PYTHON)
    if onnx is not None:
        shutil.copyfile(onnx, served / "vit/1/model.onnx")

    http, grpc, metrics = free_ports()
    triton = Triton(config=TritonConfig(model_repository=served, http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1",
                                        grpc_port=grpc, metrics_address="127.0.0.1", metrics_port=metrics, allow_gpu_metrics=False,
                                        exit_timeout_secs=10, log_file=tmp_path / "server.log"))  # fmt: skip
    client = None
    try:
        with interpreter_library_path():
            triton.run()
        wait_ready(f"127.0.0.1:{http}", ["vit", "vit_preprocess", "vit_uint8"])
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=60)

        def infer(model, images, output):
            tensor = httpclient.InferInput("images", list(images.shape), "UINT8" if images.dtype == np.uint8 else "FP32")
            tensor.set_data_from_numpy(images)
            return client.infer(model, [tensor]).as_numpy(output)

        yield infer, client
    finally:
        if client is not None:
            client.close()  # an open keep-alive connection would hold the shutdown for exit_timeout_secs
        triton.stop()


def test_generated_repository_runs_in_a_real_triton_server(repo, onnx_model, tmp_path):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with real_server(repo, tmp_path) as (infer, client):
        engine = vitfast.load_engine(onnx_model[1])
        rng = np.random.default_rng(0)
        for shape in [(3, 32, 32, 3), (2, 45, 61, 3), (8, 300, 17, 3)]:
            images = rng.integers(0, 256, shape, dtype=np.uint8)
            np.testing.assert_array_equal(infer("vit_preprocess", images, "pixels"), vitfast.preprocess(images, engine.config).numpy())
            np.testing.assert_allclose(infer("vit_uint8", images, "logits"), engine(images).numpy(), rtol=1e-5, atol=1e-5)
        with pytest.raises(InferenceServerException) as info:
            infer("vit_uint8", np.zeros((1, 0, 5, 3), np.uint8), "logits")
        assert info.value.status() == "400" and "Traceback" not in str(info.value)
        assert "preprocessing: image has no pixels: shape [0, 5, 3]; send uint8 images [B, H, W, 3] with H, W >= 1" in str(info.value)
        with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
            infer("vit_uint8", np.zeros((9, 5, 5, 3), np.uint8), "logits")
        images = rng.integers(0, 256, (2, 40, 40, 3), dtype=np.uint8)
        np.testing.assert_allclose(infer("vit_uint8", images, "logits"), engine(images).numpy(), rtol=1e-5, atol=1e-5)
        # Triton's classification extension names the classes from labels.txt ("score:index:label")
        tensor = httpclient.InferInput("images", list(images.shape), "UINT8")
        tensor.set_data_from_numpy(images)
        ranked = client.infer("vit_uint8", [tensor], outputs=[httpclient.InferRequestedOutput("logits", class_count=2)]).as_numpy("logits")
        best = engine(images).numpy().argsort(axis=1)[:, ::-1][:, :2]
        assert [[entry.decode().split(":")[1:] for entry in row] for row in ranked] == [[[str(i), LABELS[i]] for i in row] for row in best]


def test_dynamic_size_repository_runs_in_a_real_triton_server(tmp_path):
    """A --dynamic-img-size export of every token: the network model takes float images of any size in whole
    patches and answers as many tokens as they have patches; the ensemble resizes uint8 images to img_size."""
    torch.manual_seed(0)
    model = vitfast.create_model("vit_cifar_patch4_32", dynamic_img_size=True, global_pool="", num_classes=0)
    onnx_file = to_onnx(model, tmp_path / "tokens.onnx", batch=(1, 4, 8))
    repo = triton_repository(onnx_file, tmp_path / "models")
    assert list(model_config((repo / "vit/config.pbtxt").read_text()).input[0].dims) == [3, -1, -1]
    engine, dim = vitfast.load_engine(onnx_file), model.config.embed_dim
    rng = np.random.default_rng(1)
    with real_server(repo, tmp_path) as (infer, _):
        for shape in [(2, 3, 32, 32), (1, 3, 16, 48), (3, 3, 40, 24)]:
            x = rng.standard_normal(shape).astype(np.float32)
            got = infer("vit", x, "logits")
            assert got.shape == (shape[0], 1 + shape[2] * shape[3] // 16, dim)
            np.testing.assert_allclose(got, engine(x).numpy(), rtol=1e-5, atol=1e-5)
        images = rng.integers(0, 256, (2, 45, 61, 3), dtype=np.uint8)
        got = infer("vit_uint8", images, "logits")
        assert got.shape == (2, 65, dim)
        np.testing.assert_allclose(got, engine(images).numpy(), rtol=1e-5, atol=1e-5)
