"""`vitfast.data.batches` / `open_images`: image files decoded by worker threads ahead of the model give exactly what one
thread gives, in file order; the first bad file in order is the one reported; no thread or warnings filter is left
behind. `eval --against` decodes each file once for two artifacts that preprocess alike."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitfast
from vitfast.data import batches, open_image, open_images, preprocess
from vitfast.errors import InputError
from vitfast.runtime.torch_engine import TorchEngine

CONFIG = vitfast.create_model("vit_tiny_patch16_224", img_size=48, patch_size=16).config


def write_images(folder, n: int, seed: int) -> list:
    """n JPEG/PNG files of assorted sizes with fresh random pixels."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n):
        h, w = rng.integers(20, 90, size=2)
        path = folder / f"{i:03d}.{'jpg' if i % 2 else 'png'}"
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(path)
        files.append(path)
    return files


def image_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vitfast-images")]


@pytest.mark.parametrize("workers", [2, 3])
def test_threads_give_what_one_thread_gives_in_file_order(tmp_path, workers):
    files = write_images(tmp_path, 11, seed=workers)
    serial = list(batches(files, CONFIG, 4, workers=1))
    threaded = list(batches(files, CONFIG, 4, workers=workers))
    assert [len(b) for b in threaded] == [4, 4, 3]
    assert all(torch.equal(a, b) for a, b in zip(serial, threaded))
    each = torch.stack([preprocess(open_image(p), CONFIG)[0] for p in files])  # file i is row i
    assert torch.equal(torch.cat(threaded), each)
    assert not image_threads()


def test_the_first_bad_file_in_order_is_reported_and_no_thread_is_left(tmp_path):
    files = write_images(tmp_path, 12, seed=0)
    files[5].write_bytes(b"not an image")  # batch 2 of 3
    files[9].write_bytes(b"nor this")  # batch 3: decoded ahead, but the earlier one is reported
    got = []
    with pytest.raises(InputError, match=f"{files[5].name} is not an image"):
        for b in batches(files, CONFIG, 4, workers=2):
            got.append(b)
    assert len(got) == 1 and not image_threads()


def test_a_caller_that_stops_early_leaves_no_thread(tmp_path):
    files = write_images(tmp_path, 16, seed=1)
    it = batches(files, CONFIG, 2, workers=2)
    assert next(it).shape == (2, 3, 48, 48)
    it.close()
    assert not image_threads()


def test_open_image_leaves_warning_filters_alone_and_refuses_bombs_between_one_and_two_limits(tmp_path, monkeypatch):
    (path,) = write_images(tmp_path, 1, seed=2)
    w, h = Image.open(path).size
    before = list(warnings.filters)
    list(batches([path] * 8, CONFIG, 2, workers=4))
    assert warnings.filters == before  # a process-wide filter changed by one thread would leak into the others
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", w * h - 1)  # above the limit, below Pillow's own 2x refusal
    with pytest.warns(Image.DecompressionBombWarning), pytest.raises(InputError, match="too large to decode safely"):
        open_image(path)


def test_open_images_decodes_in_threads_in_file_order(tmp_path):
    files = write_images(tmp_path, 7, seed=3)
    threaded = open_images(files, workers=3)
    assert [np.asarray(i).tobytes() for i in threaded] == [np.asarray(open_image(p)).tobytes() for p in files]
    files[2].write_bytes(b"not an image")
    files[6].write_bytes(b"nor this")
    with pytest.raises(InputError, match=f"{files[2].name} is not an image"):
        open_images(files, workers=3)
    assert not image_threads()


def small_engine(seed: int, name: str, **preprocessing) -> TorchEngine:
    torch.manual_seed(seed)
    model = vitfast.create_model("vit_tiny_patch16_224", img_size=48, patch_size=16, num_classes=3, depth=2, **preprocessing)
    return TorchEngine(model, device="cpu", path=Path(name))


@pytest.mark.parametrize("other_mean", [False, True])
def test_eval_against_decodes_each_image_once_when_both_preprocess_alike(tmp_path, monkeypatch, other_mean):
    """eval --against: the two artifacts share one pass over the files when their preprocessing is the same (each file
    opened once, not once per artifact); different preprocessing takes a pass each. Results equal evaluating each alone."""
    from vitfast import data, pipeline

    for cls in range(3):
        write_images(tmp_path / f"c{cls}", 4, seed=10 + cls)
    ours = small_engine(0, "int8.onnx")
    ref = small_engine(1, "fp32.safetensors", **({"mean": (0.485, 0.456, 0.406)} if other_mean else {}))
    alone = [pipeline.evaluate(e, tmp_path, batch_size=5) for e in (ours, ref)]
    opened = []
    monkeypatch.setattr(data, "open_image", lambda p: opened.append(p) or open_image(p))
    both = pipeline.evaluate(ours, tmp_path, against=ref, batch_size=5)
    assert len(opened) == 12 * (2 if other_mean else 1)
    assert {k: both[k] for k in ("top1", "top5", "n")} == {k: alone[0][k] for k in ("top1", "top5", "n")}
    assert {k: both["against"][k] for k in ("top1", "top5", "n")} == {k: alone[1][k] for k in ("top1", "top5", "n")}
    # the top-1 agreement is counted image by image: the same as from each alone's predictions
    tops = pipeline.predict_topk([ours, ref], data.find_images(tmp_path), 5, workers=1)
    alone_tops = [pipeline.predict_topk([e], data.find_images(tmp_path), 5, workers=1)[0] for e in (ours, ref)]
    assert all(torch.equal(a, b) for a, b in zip(tops, alone_tops))
    assert both["against"]["top1_agreement"] == int((tops[0][:, 0] == tops[1][:, 0]).sum()) / 12


# EXIF Orientation -> the transpose that turns the stored pixels upright (the EXIF 2.3 table, written out here)
ORIENTATIONS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
                5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
                8: Image.Transpose.ROTATE_90}  # fmt: skip


def save_with_orientation(path: Path, pixels: np.ndarray, orientation: int, mode: str = "RGB") -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation  # the Orientation tag
    Image.fromarray(pixels).convert(mode).save(path, exif=exif)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_files_are_read_upright_as_their_exif_orientation_says(tmp_path, orientation):
    pixels = np.random.default_rng(orientation).integers(0, 256, size=(23, 41, 3), dtype=np.uint8)  # not square
    stored = tmp_path / "photo.png"  # lossless, so the comparison is exact
    save_with_orientation(stored, pixels, orientation)
    expected = Image.fromarray(pixels)
    expected = expected.transpose(ORIENTATIONS[orientation]) if orientation in ORIENTATIONS else expected
    got = open_image(stored)
    assert got.mode == "RGB" and np.array_equal(np.asarray(got), np.asarray(expected))
    transformers = pytest.importorskip("transformers")  # its pipelines' loader, an independent reference
    assert np.array_equal(np.asarray(got), np.asarray(transformers.image_utils.load_image(str(stored))))
    from vitfast.inspect import load_image  # the figures of `vitfast inspect` lie on the same upright pixels

    assert np.array_equal(np.asarray(load_image(stored).convert("RGB")), np.asarray(expected))


def test_a_turned_transparent_image_keeps_its_alpha(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, size=(9, 17, 4), dtype=np.uint8)
    stored = tmp_path / "logo.png"
    save_with_orientation(stored, pixels, 6, mode="RGBA")
    got = open_image(stored)
    assert got.mode == "RGBA" and np.array_equal(np.asarray(got), np.asarray(Image.fromarray(pixels).transpose(ORIENTATIONS[6])))


def test_predictions_of_a_sideways_stored_photo_are_those_of_the_upright_one(tmp_path):
    model = vitfast.create_model("vit_tiny_patch16_224", img_size=48, patch_size=16, num_classes=5).eval()
    upright_pixels = np.random.default_rng(3).integers(0, 256, size=(60, 37, 3), dtype=np.uint8)
    save_with_orientation(tmp_path / "upright.png", upright_pixels, 1)
    # a camera held sideways stores the pixels turned and tags 6: "turn 90 degrees clockwise to show"
    stored = np.asarray(Image.fromarray(upright_pixels).transpose(Image.Transpose.ROTATE_90))
    save_with_orientation(tmp_path / "sideways.png", stored, 6)
    a, b = (torch.cat(list(batches([tmp_path / n], model.config, 1, workers=1))) for n in ("upright.png", "sideways.png"))
    assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(model(a), model(b))


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16_bit_greyscale_files_keep_their_tones(tmp_path, suffix):
    """A 16-bit greyscale file reads as its high byte (Pillow's own 16 -> 8 bits for colour files), not clipped to
    255 by Pillow's RGB conversion (which left 99.6% of a photo white)."""
    deep = np.random.default_rng(0).integers(0, 65536, size=(19, 27), dtype=np.uint16)
    path = tmp_path / f"scan{suffix}"
    Image.fromarray(deep).save(path)
    got = np.asarray(open_image(path).convert("RGB"))
    assert got.shape == (19, 27, 3) and all(np.array_equal(got[..., c], (deep >> 8).astype(np.uint8)) for c in range(3))
    from vitfast.inspect import load_image

    assert np.array_equal(np.asarray(load_image(path).convert("RGB")), got)


@pytest.mark.parametrize("mode, suffix", [("LA", ".png"), ("CMYK", ".tif"), ("RGBA", ".png")])
def test_files_of_two_and_four_bands_are_read_band_by_band(tmp_path, mode, suffix):
    """An LA file is a 2-channel model's input and a CMYK or RGBA file a 4-channel model's, each band one channel as the
    uint8 array [H, W, C] of the same pixels gives them (LA was made RGBA and CMYK RGB before the model saw them); a file
    of another band count is refused naming its own mode."""
    chans = len(mode)
    pixels = np.random.default_rng(chans).integers(0, 256, size=(23, 41, chans), dtype=np.uint8)
    path = tmp_path / f"bands{suffix}"
    Image.frombytes(mode, (41, 23), pixels.tobytes()).save(path)
    config = vitfast.create_model("vit_tiny_patch16_224", img_size=48, patch_size=16, in_chans=chans, mean=(0.5,) * chans,
                                  std=(0.5,) * chans).config  # fmt: skip
    torch.testing.assert_close(next(batches([path], config, 1, workers=1)), preprocess(pixels, config), atol=0, rtol=0)
    Image.fromarray(pixels[..., :3] if chans == 4 else pixels[..., :1].repeat(3, axis=2)).save(tmp_path / "rgb.png")
    with pytest.raises(InputError, match=f"a RGB image has 3 channels and this model takes {chans}"):
        next(batches([tmp_path / "rgb.png"], config, 1, workers=1))


@pytest.mark.parametrize("pixels", [np.zeros((5, 6), np.float32), np.zeros((5, 6), np.int32)], ids=["float", "int32"])
def test_pixels_of_unknown_range_are_refused_by_name(tmp_path, pixels):
    path = tmp_path / "depth.tif"
    Image.fromarray(pixels).save(path)
    with pytest.raises(InputError, match="depth.tif holds .* pixels .* save it as an 8- or 16-bit image"):
        open_image(path)
    from vitfast.inspect import load_image

    with pytest.raises(InputError, match="save it as an 8- or 16-bit image"):
        load_image(path)
