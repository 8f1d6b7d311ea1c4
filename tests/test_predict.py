"""`vitfast predict`: top-k classes of image files and folders from any artifact, as transformers' own processor and
model give them; features and tokens written to .npz / .jsonl; bad input refused before anything is written.
Reference: a random transformers ViT classifier saved with `save_pretrained`, its `ViTImageProcessor`, in fp32."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers", reason="the reference is a transformers ViT and its processor")

from vitfast.errors import InputError  # noqa: E402
from vitfast.scores import top_classes  # noqa: E402

from test_foreign_onnx import IMG, MEAN, STD, hf_model, run  # noqa: E402
from test_image_loading import write_images  # noqa: E402

LABELS = tuple(f"kind{i}" for i in range(10))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(folder of a saved transformers ViT classifier with its processor and labels, the model, images folder)."""
    root = tmp_path_factory.mktemp("predict")
    model = hf_model(seed=3)
    model.config.id2label = dict(enumerate(LABELS))
    model.config.label2id = {name: i for i, name in enumerate(LABELS)}
    model.save_pretrained(root / "hf")
    processor = transformers.ViTImageProcessor(size={"height": IMG, "width": IMG}, image_mean=list(MEAN), image_std=list(STD), resample=3)
    processor.save_pretrained(root / "hf")
    write_images(root / "images" / "b", 3, seed=5)
    write_images(root / "images" / "a", 4, seed=6)
    return root / "hf", model, processor, root / "images"


def reference(model, processor, files, k=5, scores="softmax"):
    """transformers' top-k (indices, scores) for each file, its own processor preprocessing the image."""
    with torch.no_grad():
        logits = model(**processor([Image.open(f).convert("RGB") for f in files], return_tensors="pt")).logits
    values = {"softmax": logits.softmax(-1), "sigmoid": logits.sigmoid(), "logits": logits}[scores]
    top = values.topk(k, dim=-1)
    return top.indices.tolist(), top.values.tolist()


def predictions(done):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_top_k_of_files_and_folders_equals_transformers(hf):
    folder, model, processor, images = hf
    single = images / "b" / "001.jpg"
    result = predictions(run("predict", folder, single, images, "--top-k", 3, "--json"))
    files = [single, *sorted((images / "a").iterdir()), *sorted((images / "b").iterdir())]  # a file, then a folder, sorted
    assert [row["file"] for row in result["predictions"]] == [str(f) for f in files]
    assert (result["n"], result["k"], result["scores"], result["backend"]) == (8, 3, "softmax", "pytorch")
    indices, values = reference(model, processor, files, k=3)
    for row, idx, val in zip(result["predictions"], indices, values):
        assert [c["index"] for c in row["top_k"]] == idx
        assert [c["label"] for c in row["top_k"]] == [LABELS[i] for i in idx]
        assert [c["score"] for c in row["top_k"]] == pytest.approx(val, abs=1e-5)
    text = run("predict", folder, single, "--top-k", 2)  # the human form: one line per image, labels and scores
    assert text.returncode == 0 and text.stdout == f"{single}: {LABELS[indices[0][0]]} {values[0][0]:.4g}, {LABELS[indices[0][1]]} {values[0][1]:.4g}\n"


def test_onnx_export_writes_the_same_predictions_to_csv_and_jsonl(hf, tmp_path):
    folder, model, processor, images = hf
    onnx_path = tmp_path / "vit.onnx"
    assert run("export", "--checkpoint", folder, "--format", "onnx", "--out", onnx_path).returncode == 0
    as_json = predictions(run("predict", onnx_path, images, "--json"))["predictions"]
    done = run("predict", onnx_path, images, "--out", tmp_path / "p.csv")
    assert done.returncode == 0 and "wrote 7 images' top-5 classes" in done.stderr and done.stdout == ""
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert [r["file"] for r in rows] == [p["file"] for p in as_json]
    for r, p in zip(rows, as_json):
        assert [int(r[f"index_{i}"]) for i in range(1, 6)] == [c["index"] for c in p["top_k"]]
        assert [r[f"label_{i}"] for i in range(1, 6)] == [c["label"] for c in p["top_k"]]
        assert [float(r[f"score_{i}"]) for i in range(1, 6)] == pytest.approx([c["score"] for c in p["top_k"]], rel=1e-5)
    assert run("predict", onnx_path, images, "--out", tmp_path / "p.jsonl").returncode == 0
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert lines == as_json
    files = [images / row["file"].split("/images/")[1] for row in as_json]
    indices, values = reference(model, processor, files)
    assert [[c["index"] for c in row["top_k"]] for row in as_json] == indices


def copy_with_problem_type(folder, dest, problem_type):
    """A copy of the saved classifier whose config.json says `problem_type`."""
    dest.mkdir()
    for f in folder.iterdir():
        dest.joinpath(f.name).write_bytes(f.read_bytes())
    config = json.loads((dest / "config.json").read_text()) | {"problem_type": problem_type}
    (dest / "config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.parametrize("problem_type, scores", [("multi_label_classification", "sigmoid"), ("regression", "logits")])
def test_problem_type_scores_as_transformers_pipeline_and_survives_export(hf, tmp_path, problem_type, scores):
    """transformers' own image-classification pipeline is the reference for both the rule and the numbers; the
    vitfast ONNX export keeps the rule (in its sidecar) with no config.json beside it."""
    folder, _, _, images = hf
    saved = copy_with_problem_type(folder, tmp_path / "hf", problem_type)
    files = sorted((images / "a").iterdir())
    pipe = transformers.pipeline("image-classification", model=str(saved), top_k=4)
    expected = [pipe(str(f)) for f in files]
    onnx_path = tmp_path / "out" / "vit.onnx"
    assert run("export", "--checkpoint", saved, "--format", "onnx", "--out", onnx_path).returncode == 0
    for artifact in (saved, onnx_path):
        done = run("predict", artifact, images / "a", "--top-k", 4, "--json")
        result = predictions(done)
        assert result["scores"] == scores and f"problem_type {problem_type}" in done.stderr, artifact
        for row, want in zip(result["predictions"], expected):
            assert [c["label"] for c in row["top_k"]] == [w["label"] for w in want]
            assert [c["score"] for c in row["top_k"]] == pytest.approx([w["score"] for w in want], abs=1e-4)


def test_problem_type_and_labels_given_for_any_artifact_and_scores_chosen(hf, tmp_path):
    folder, model, processor, images = hf
    files = sorted((images / "a").iterdir())
    onnx_path = tmp_path / "vit.onnx"
    assert run("export", "--checkpoint", folder, "--format", "onnx", "--out", onnx_path).returncode == 0
    names = tmp_path / "names.txt"
    names.write_text("".join(f"name{i}\n" for i in range(10)))
    done = run("predict", onnx_path, images / "a", "--problem-type", "multi_label_classification", "--labels", names, "--json")
    result = predictions(done)
    indices, values = reference(model, processor, files, scores="sigmoid")
    assert result["scores"] == "sigmoid" and [[c["label"] for c in row["top_k"]] for row in result["predictions"]] == [
        [f"name{i}" for i in idx] for idx in indices]  # fmt: skip
    assert np.allclose([[c["score"] for c in row["top_k"]] for row in result["predictions"]], values, rtol=0, atol=1e-4)
    raw = predictions(run("predict", folder, images / "a", "--scores", "logits", "--top-k", 10, "--json"))
    indices, values = reference(model, processor, files, k=10, scores="logits")
    assert np.allclose([[c["score"] for c in row["top_k"]] for row in raw["predictions"]], values, rtol=0, atol=1e-4)
    names.write_text("one\ntwo\n")
    done = run("predict", onnx_path, images / "a", "--labels", names)
    assert done.returncode == 2 and "2 labels for 10 classes" in done.stderr and "Traceback" not in done.stderr
    done = run("predict", onnx_path, images / "a", "--problem-type", "multilabel")
    assert done.returncode == 2 and "invalid choice: 'multilabel'" in done.stderr


def test_id2label_names_with_line_breaks_load_with_spaces_and_say_so(hf, tmp_path):
    """A Hub classifier whose id2label has a name with a line break loads (it was refused as an invalid config, even with
    --labels given), the break read as a space and reported as a guess; --labels settles it and the note goes."""
    folder, _, _, images = hf
    dest = tmp_path / "hf"
    dest.mkdir()
    for f in folder.iterdir():
        dest.joinpath(f.name).write_bytes(f.read_bytes())
    config = json.loads((dest / "config.json").read_text())
    config["id2label"] |= {"3": "two\r\nlines", "7": "trailing\n"}
    (dest / "config.json").write_text(json.dumps(config))
    done = run("predict", dest, images / "a", "--top-k", 10, "--json")
    labels = {c["label"] for c in predictions(done)["predictions"][0]["top_k"]}
    assert {"two lines", "trailing "} <= labels and "line breaks (3, 7) read with spaces" in done.stderr
    names = tmp_path / "names.txt"
    names.write_text("".join(f"name{i}\n" for i in range(10)))
    done = run("predict", dest, images / "a", "--labels", names, "--json")
    assert predictions(done)["predictions"][0]["top_k"][0]["label"].startswith("name") and "line breaks" not in done.stderr


def test_features_and_tokens_are_written_whole(hf, tmp_path):
    folder, model, processor, images = hf
    files = sorted((images / "a").iterdir())
    refused = run("predict", folder, images, "--num-classes", "0")
    assert refused.returncode == 2 and "returns outputs [64] per image, not classes: give --out FILE.npz" in refused.stderr
    assert predictions(run("predict", folder, images / "a", "--num-classes", "0", "--out", tmp_path / "f.npz", "--json"))["output"] == "outputs [64]"
    saved = np.load(tmp_path / "f.npz")
    assert list(saved["files"]) == [str(f) for f in files] and saved["outputs"].shape == (4, 64)
    with torch.no_grad():
        hidden = model.vit(**processor([Image.open(f).convert("RGB") for f in files], return_tensors="pt")).last_hidden_state
    assert np.abs(saved["outputs"] - hidden[:, 0].numpy()).max() < 1e-4  # the normalised class token
    assert run("predict", folder, images / "a", "--num-classes", "0", "--global-pool", "none", "--out", tmp_path / "t.jsonl").returncode == 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == [str(f) for f in files]
    assert np.abs(np.array([r["output"] for r in rows]) - hidden.numpy()).max() < 1e-4  # every token, as transformers' last_hidden_state


def test_npz_is_streamed_batch_by_batch_and_loads_as_numpy_wrote_it(tmp_path):
    """Each batch is in the file before the next one is computed (a folder's tokens need not fit in memory)."""
    from vitfast.cli.predict import write_npz

    rng = np.random.default_rng(8)
    batches = [([tmp_path / f"{b}-{i}.png" for i in range(n)], torch.from_numpy(rng.standard_normal((n, 50, 64)).astype(np.float32)))
               for b, n in enumerate((4, 4, 3))]  # fmt: skip
    out, sizes = tmp_path / "o.npz", []

    def results():
        for batch in batches:
            yield batch
            sizes.append(out.stat().st_size)

    assert write_npz(results(), out, 11) == 11
    block = 4 * 50 * 64 * 4  # bytes of a batch, past the file's write buffer
    assert sizes[0] >= block and sizes[1] >= sizes[0] + block  # written as it came
    saved = np.load(out)
    assert saved["outputs"].dtype == np.float32 and np.array_equal(saved["outputs"], np.concatenate([b[1].numpy() for b in batches]))
    assert list(saved["files"]) == [str(f) for b in batches for f in b[0]]


def test_bad_input_is_refused_and_nothing_is_left_half_written(hf, tmp_path):
    folder, _, _, images = hf
    cases = {
        ("predict", folder, tmp_path / "missing.png"): "no such image file or folder",
        ("predict", folder, images, "--out", tmp_path / "p.txt"): "give a file ending in .jsonl, .csv, .npz",
        ("predict", folder, images, "--out", tmp_path / "p.npz", "--top-k", "2"): "holds the logits themselves",
    }
    for args, message in cases.items():
        done = run(*args)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    bad = tmp_path / "bad"
    write_images(bad, 70, seed=7)  # a bad file in the third batch of 32: the first two were already written out
    (bad / "065.png").write_bytes(b"not an image")
    done = run("predict", folder, bad, "--out", tmp_path / "p.jsonl")
    assert done.returncode == 2 and "065.png is not an image" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no partial p.jsonl, no staging folder
    (tmp_path / "p.csv").write_text("mine")
    done = run("predict", folder, images, "--out", tmp_path / "p.csv")
    assert done.returncode == 2 and "already exists; pass --force" in done.stderr and (tmp_path / "p.csv").read_text() == "mine"
    assert run("predict", folder, images, "--out", tmp_path / "p.csv", "--force").returncode == 0
    assert (tmp_path / "p.csv").read_text().startswith("file,index_1,label_1,score_1")


def test_top_classes_scores():
    logits = np.random.default_rng(4).standard_normal((6, 9)).astype(np.float32) * 4
    idx, val = top_classes(logits, 3)
    ref = torch.from_numpy(logits).double().softmax(-1).topk(3)
    assert idx.tolist() == ref.indices.tolist() and np.allclose(val, ref.values.numpy(), rtol=1e-6)
    idx, val = top_classes(logits, 20, "sigmoid")  # k past the classes: all of them
    assert idx.shape == (6, 9) and np.allclose(val, np.sort(1 / (1 + np.exp(-logits.astype(np.float64))), axis=1)[:, ::-1])
    idx, val = top_classes(np.zeros((1, 4), np.float32), 2, "logits")  # ties: the lower index first
    assert idx.tolist() == [[0, 1]] and val.tolist() == [[0, 0]]
    with pytest.raises(InputError, match="scores must be one of"):
        top_classes(logits, 3, "probits")


def test_top_k_and_scores_are_refused_for_features(hf, tmp_path):
    folder, _, _, images = hf
    refused = run("predict", folder, images, "--num-classes", "0", "--out", tmp_path / "f.jsonl", "--top-k", 3)
    assert refused.returncode == 2 and "--top-k / --scores do not apply" in refused.stderr
    assert not (tmp_path / "f.jsonl").exists()


def test_file_names_that_are_not_utf8_are_written_as_their_bytes(hf, tmp_path):
    """A file name in latin-1 (a lone surrogate in Python) goes into the CSV as the bytes it has on disk, not a traceback."""
    import os

    folder, _, _, images = hf
    odd = tmp_path / "odd"
    odd.mkdir()
    name = os.fsdecode(b"caf\xe9.png")
    Image.open(next((images / "a").iterdir())).save(odd / name)
    done = run("predict", folder, odd, "--out", tmp_path / "p.csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.reader((tmp_path / "p.csv").open(encoding="utf-8", errors="surrogateescape")))
    assert rows[1][0] == str(odd / name)
