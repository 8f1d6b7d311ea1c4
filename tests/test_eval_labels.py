"""`vitfast eval`: class folders matched to the model's labels (or --labels), a class-count
mismatch refused, top-1 and top-5, and `--against REF` for the accuracy difference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitfast
from vitfast.cli import main

LABELS = ("ant", "bee", "cat", "dog", "eel", "fox", "gnu")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(3)
    model = vitfast.create_model("vit_cifar_patch4_32", num_classes=7, labels=LABELS, crop_pct=1.0)
    return vitfast.save_checkpoint(model, tmp_path_factory.mktemp("ckpt") / "m.safetensors")


def _folder(root, classes, per_class=3, seed=0):
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (36, 44, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def _expected(ckpt, root, index):
    """top-1 / top-5 computed here from the model's own logits, image by image."""
    model = vitfast.load_checkpoint(ckpt)
    hits1 = hits5 = n = 0
    for folder in sorted(p for p in root.iterdir()):
        for image in sorted(p for p in folder.iterdir() if p.is_file()):
            with torch.no_grad():
                logits = model(vitfast.preprocess(Image.open(image), model.config))[0]
            target = index[folder.name]
            hits1 += int(logits.argmax() == target)
            hits5 += int(target in logits.topk(5).indices.tolist())
            n += 1
    return hits1 / n, hits5 / n, n


def test_folders_named_by_labels_are_matched_by_name(ckpt, tmp_path, capsys):
    data = _folder(tmp_path / "data", ["fox", "bee", "gnu"])  # a subset, not in label order
    assert main(["eval", str(ckpt), "--data", str(data), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    top1, top5, n = _expected(ckpt, data, {name: i for i, name in enumerate(LABELS)})
    assert (result["top1"], result["top5"], result["n"], result["k"]) == (pytest.approx(top1), pytest.approx(top5), n, 5)


def test_symlinked_class_folders_are_evaluated_and_a_link_cycle_is_entered_once(ckpt, tmp_path, capsys):
    """Class folders linked into DIR (how an ImageNet subset is usually made) count as timm's and torchvision's folder
    readers count them; a link back up the tree (data/bee/up -> data) is not walked round and round."""
    from vitfast.data import find_images

    store = _folder(tmp_path / "store", ["fox", "bee", "gnu"])
    data = tmp_path / "data"
    data.mkdir()
    for name in ("fox", "bee", "gnu"):
        (data / name).symlink_to(store / name, target_is_directory=True)
    (store / "bee" / "up").symlink_to(data, target_is_directory=True)
    assert find_images(data) == sorted(data / name / f"{i}.png" for name in ("fox", "bee", "gnu") for i in range(3))
    assert main(["eval", str(ckpt), "--data", str(data), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    top1, top5, n = _expected(ckpt, data, {name: i for i, name in enumerate(LABELS)})
    assert (result["top1"], result["top5"], result["n"], result["classes"]) == (pytest.approx(top1), pytest.approx(top5), n, 3)


def test_eval_data_that_is_a_file_or_missing_says_which(ckpt, tmp_path, capsys):
    image = _folder(tmp_path / "data", ["one"]) / "one" / "0.png"
    assert main(["eval", str(ckpt), "--data", str(image)]) == 2
    assert f"{image} is a file, not a folder of images" in capsys.readouterr().err
    assert main(["eval", str(ckpt), "--data", str(tmp_path / "nowhere")]) == 2
    assert "image folder not found" in capsys.readouterr().err


def test_a_class_count_mismatch_is_refused(ckpt, tmp_path, capsys):
    data = _folder(tmp_path / "data", ["one", "two"])
    assert main(["eval", str(ckpt), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "the model has 7 classes but" in err and "2 class folders (one, two)" in err and err.count("\n") == 1


def test_empty_class_folders_and_loose_images_are_named_not_dropped_silently(ckpt, tmp_path, capsys):
    """A class folder with no image and images directly in DIR are left out with a warning naming them; a class count
    that misses the empty folder says so in its error."""
    data = _folder(tmp_path / "data", ["fox", "bee"])
    top1, top5, n = _expected(ckpt, data, {name: i for i, name in enumerate(LABELS)})
    (data / "gnu").mkdir()
    (data / "gnu" / "notes.txt").write_text("to do")
    (data / ".ipynb_checkpoints").mkdir()
    for name in ("loose.png", "also.jpg"):
        Image.new("RGB", (36, 44)).save(data / name)
    assert main(["eval", str(ckpt), "--data", str(data), "--json", "--quiet"]) == 0
    result, err = json.loads((captured := capsys.readouterr()).out), captured.err
    assert (result["top1"], result["top5"], result["n"]) == (pytest.approx(top1), pytest.approx(top5), n)
    assert f"vitfast: warning: images directly in {data}, in no class folder, are left out: 2 (also.jpg, loose.png)" in err
    assert f"vitfast: warning: class folders of {data} with no images (.bmp, " in err and ".webp) are left out: gnu\n" in err
    numbered = _folder(tmp_path / "numbered", [str(i) for i in range(7) if i != 3])
    (numbered / "3").mkdir()
    assert main(["eval", str(ckpt), "--data", str(numbered)]) == 2
    assert "has 6 class folders (0, 1, 2, 4, 5, ...; 1 more without images: 3); give a folder" in capsys.readouterr().err


def test_labels_file_names_the_classes(ckpt, tmp_path, capsys):
    names = [f"n0{i}" for i in range(7)]
    (tmp_path / "labels.txt").write_text("\n".join(names) + "\n")
    data = _folder(tmp_path / "data", ["n06", "n02"])
    assert main(["eval", str(ckpt), "--data", str(data), "--labels", str(tmp_path / "labels.txt"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    top1, top5, _ = _expected(ckpt, data, {name: i for i, name in enumerate(names)})
    assert (result["top1"], result["top5"]) == (pytest.approx(top1), pytest.approx(top5))
    (tmp_path / "short.json").write_text(json.dumps(names[:3]))
    assert main(["eval", str(ckpt), "--data", str(data), "--labels", str(tmp_path / "short.json")]) == 2
    assert "3 labels for a model with 7 classes" in capsys.readouterr().err


def test_imagenet_class_index_json_names_the_classes_and_its_wnids_match_the_folders(ckpt, tmp_path, capsys):
    """imagenet_class_index.json ({"0": ["n01440764", "tench"], ...}): the names are the labels (predict shows them) and
    class folders named by WordNet id are matched by it; a value neither a name nor an [id, name] pair is refused."""
    wnids = [f"n0{i}44" for i in range(7)]
    index = tmp_path / "imagenet_class_index.json"
    index.write_text(json.dumps({str(i): [wnid, name] for i, (wnid, name) in enumerate(zip(wnids, LABELS))}))
    data = _folder(tmp_path / "data", [wnids[5], wnids[1]])
    assert main(["eval", str(ckpt), "--data", str(data), "--labels", str(index), "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    top1, top5, n = _expected(ckpt, data, {wnid: i for i, wnid in enumerate(wnids)})
    assert (result["top1"], result["top5"], result["n"]) == (pytest.approx(top1), pytest.approx(top5), n)
    image = data / wnids[5] / "0.png"
    assert main(["predict", str(ckpt), str(image), "--labels", str(index), "--top-k", "7", "--json"]) == 0
    assert {row["label"] for row in json.loads(capsys.readouterr().out)["predictions"][0]["top_k"]} == set(LABELS)
    index.write_text(json.dumps({str(i): {"name": name} for i, name in enumerate(LABELS)}))
    assert main(["eval", str(ckpt), "--data", str(data), "--labels", str(index)]) == 2
    err = capsys.readouterr().err
    assert 'class 0 is {"name": "ant"}; give each class a name, or an [id, name] pair' in err and err.count("\n") == 1


def test_against_reports_the_accuracy_difference(ckpt, tmp_path, capsys):
    pytest.importorskip("onnxruntime", reason="the compared artifact is an ONNX export")
    assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--precision", "fp16", "--out", str(tmp_path / "m.onnx")]) == 0
    data = _folder(tmp_path / "data", LABELS, per_class=2, seed=1)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "m.onnx"), "--data", str(data), "--against", str(ckpt), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    top1, top5, _ = _expected(ckpt, data, {name: i for i, name in enumerate(LABELS)})
    against = result["against"]
    assert (against["top1"], against["top5"]) == (top1, top5)  # exact fractions of n images, as counted here
    assert result["n"] == 14 and all(round(result[k] * 14) / 14 == result[k] for k in ("top1", "top5"))
    assert against["top1_diff"] == pytest.approx(result["top1"] - top1) and 0.8 <= against["top1_agreement"] <= 1
    assert main(["eval", str(tmp_path / "m.onnx"), "--data", str(data), "--against", str(ckpt)]) == 0
    assert "points)" in capsys.readouterr().out


def test_against_a_model_of_every_tokens_logits_is_refused_as_the_artifact_is(ckpt, tmp_path, capsys):
    """A per-token classifier ([B, T, 7], global_pool none) has no one prediction per image to score, given first or
    as --against: one line naming it, not a traceback from comparing [N, T, k] ranks with the targets."""
    torch.manual_seed(4)
    model = vitfast.create_model("vit_cifar_patch4_32", num_classes=7, labels=LABELS, crop_pct=1.0, global_pool="")
    tokens = vitfast.save_checkpoint(model, tmp_path / "tokens.safetensors")
    data = _folder(tmp_path / "data", LABELS[:2])
    for first, second in ((tokens, ckpt), (ckpt, tokens)):
        capsys.readouterr()
        assert main(["eval", str(first), "--data", str(data), "--against", str(second), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"{tokens} returns every token (global_pool none), not one prediction per image" in err and err.count("\n") == 1


def test_numbered_class_folders_are_classes_in_numeric_order(tmp_path, capsys):
    """Folders 0..11 of a model without labels are classes 0..11 (timm's natural order), not "0, 1, 10, 11, 2": each image
    is scored against the class its folder's number names, checked against the model's own logits."""
    torch.manual_seed(5)
    model = vitfast.create_model("vit_cifar_patch4_32", num_classes=12, crop_pct=1.0)
    ckpt = vitfast.save_checkpoint(model, tmp_path / "m.safetensors")
    data = _folder(tmp_path / "data", [str(i) for i in range(12)], per_class=2)
    assert main(["eval", str(ckpt), "--data", str(data), "--json"]) == 0
    top1, top5, n = _expected(ckpt, data, {str(i): i for i in range(12)})
    result = json.loads(capsys.readouterr().out)
    assert (result["top1"], result["top5"], result["n"]) == (pytest.approx(top1), pytest.approx(top5), n)


def test_eval_help_gives_the_folder_order_eval_uses(capsys):
    """It said "sorted", which puts folder 10 before 2; eval takes them in natural order (the test above)."""
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "else in natural order (2 before 10) = class index" in " ".join(capsys.readouterr().out.split())


def test_folders_partly_named_after_labels_are_refused(ckpt, tmp_path, capsys):
    """Folders "ant", "bee", "cats": sorted order would score the ants as class 0 but the bees as class 1 and "cats" as
    class 2 only by luck of spelling; a folder set where some names are labels and some are not is refused by name."""
    data = _folder(tmp_path / "data", ["ant", "bee", "cats", "dog", "eel", "fox", "gnu"])
    assert main(["eval", str(ckpt), "--data", str(data)]) == 2
    assert "are not: cats; rename those" in capsys.readouterr().err


def test_tied_logits_rank_by_class_index_as_predict_does(tmp_path, capsys):
    """A head of zeros ties every class: eval counts class 0 as the top-1, the class `vitfast predict` prints first."""
    model = vitfast.create_model("vit_cifar_patch4_32", num_classes=10, crop_pct=1.0)
    torch.nn.init.zeros_(model.head.weight), torch.nn.init.zeros_(model.head.bias)
    ckpt = vitfast.save_checkpoint(model, tmp_path / "zero.safetensors")
    data = _folder(tmp_path / "data", [f"c{i}" for i in range(10)], per_class=1)
    assert main(["eval", str(ckpt), "--data", str(data), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["top1"], result["top5"]) == (pytest.approx(0.1), pytest.approx(0.5))  # c0 hits top-1; c0..c4 top-5


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_are_an_error_naming_the_image_not_a_ranking(tmp_path, capsys, bad):
    model = vitfast.create_model("vit_cifar_patch4_32", num_classes=4, crop_pct=1.0)
    with torch.no_grad():
        model.head.bias[2] = bad
    ckpt = vitfast.save_checkpoint(model, tmp_path / "broken.safetensors")
    data = _folder(tmp_path / "data", ["a", "b", "c", "d"], per_class=1)
    assert main(["eval", str(ckpt), "--data", str(data)]) == 2
    assert "gave NaN or inf outputs for 4 of 4 images" in capsys.readouterr().err
    assert main(["predict", str(ckpt), str(data), "--out", str(tmp_path / "p.csv")]) == 2
    assert "gave NaN or inf outputs" in capsys.readouterr().err and not (tmp_path / "p.csv").exists()
    assert main(["check", str(ckpt), "--json"]) == 1  # a check that fails prints strict JSON: null, not NaN
    result = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert result["passed"] is False


def test_check_passes_a_model_whose_outputs_are_all_zero(tmp_path, capsys):
    """Identical all-zero outputs agree (their cosine would be 0/0, read as 0 before)."""
    model = vitfast.create_model("vit_cifar_patch4_32", num_classes=10)
    torch.nn.init.zeros_(model.head.weight), torch.nn.init.zeros_(model.head.bias)
    ckpt = vitfast.save_checkpoint(model, tmp_path / "zero.safetensors")
    onnx = tmp_path / "zero.onnx"
    assert main(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--out", str(onnx), "--quiet"]) == 0
    assert main(["check", str(onnx), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["passed"]
