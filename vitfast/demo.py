"""`make demo`: the main job as it stands today, end to end on CPU with no downloads.

1. Make a Hugging Face ViT checkpoint (random weights: nothing can be downloaded here) the way a
   user would have one on disk, load it with `vitfast.load_checkpoint`, and compare logits with
   `transformers` itself.
2. Load it again at a higher resolution (position embeddings resized) and compare with HF's
   `interpolate_pos_encoding`.
3. Save a vitfast checkpoint, reload it, check the outputs are bit-identical.
4. Show attention maps from the math path.
5. Leave the checkpoint and a folder of calibration images in `--out` for the export steps that
   `make demo` runs next (`vitfast export / check / eval`).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from PIL import Image

import vitfast


def _row(label: str, value: str) -> None:
    print(f"  {label:<50} {value}")


def hf_round_trip(workdir: Path) -> Path | None:
    try:
        import transformers  # lazy: optional ([test] extra) and slow to import; the demo skips this step without it
    except ImportError:
        print("transformers is not installed: skipping the Hugging Face parity step (pip install transformers, or vitfast's test extra)")
        return None
    print("\n[1] Hugging Face checkpoint -> vitfast")
    cfg = transformers.ViTConfig(
        image_size=64, patch_size=16, hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
        intermediate_size=768, num_labels=10,
    )  # fmt: skip
    hf = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.02 * torch.randn_like(p))
    hf_dir = workdir / "hf-vit"
    hf.save_pretrained(hf_dir)
    processor = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor  # PIL backend
    processor(size={"height": 64, "width": 64}).save_pretrained(hf_dir)  # its preprocessing: vitfast follows it
    model = vitfast.load_checkpoint(hf_dir)
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        err = (model(x) - hf(pixel_values=x).logits).abs().max().item()
    _row("loaded", f"{hf_dir.name}/ -> embed_dim={model.config.embed_dim} depth={model.config.depth}")
    _row("max |logits - transformers| (fp32)", f"{err:.2e}")

    print("\n[2] the same checkpoint at 96x96 (position embeddings resized)")
    big = vitfast.load_checkpoint(hf_dir, img_size=96)
    xb = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        err = (big(xb) - hf(pixel_values=xb, interpolate_pos_encoding=True).logits).abs().max().item()
    _row("pos_embed", f"{tuple(model.pos_embed.shape)} -> {tuple(big.pos_embed.shape)}")
    _row("max |logits - HF interpolate_pos_encoding|", f"{err:.2e}")
    return hf_dir


def vitfast_round_trip(out: Path, source: Path | None) -> vitfast.VisionTransformer:
    print("\n[3] vitfast checkpoint round trip (safetensors, config in the metadata)")
    model = vitfast.load_checkpoint(source) if source else vitfast.create_model("vit_cifar_patch4_32")
    path = vitfast.save_checkpoint(model, out / "model.safetensors")
    again = vitfast.load_checkpoint(path)
    x = torch.randn(2, 3, *model.config.img_hw)
    with torch.no_grad():
        same = torch.equal(model(x), again(x))
    _row("saved", f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    _row("reloaded outputs bit-identical", str(same))
    return again


def attention_maps(model: vitfast.VisionTransformer) -> None:
    print("\n[4] attention maps (math path)")
    x = torch.randn(1, 3, *model.config.img_hw)
    with torch.no_grad():
        _, attns = model.forward_features(x, return_attention=True)
    cls_attn = attns[-1][0, :, 0, 1:].mean(0)  # last layer, head-averaged, class token -> patches
    _row("layers x [B, heads, T, T]", f"{len(attns)} x {list(attns[0].shape)}")
    _row("last-layer class-token attention, max patch", f"{cls_attn.max().item():.3f} (uniform = {1 / cls_attn.numel():.3f})")


def calibration_images(out: Path, config: vitfast.ViTConfig, n: int = 64) -> None:
    """Random RGB images as PNGs: enough to show INT8 calibration run; not a real calibration set."""
    folder = out / "calib"
    folder.mkdir(parents=True, exist_ok=True)
    rng = torch.Generator().manual_seed(0)
    h, w = config.img_hw
    for i in range(n):
        pixels = torch.randint(0, 256, (h, w, 3), generator=rng, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    print(f"\n[5] wrote {n} random calibration images to {folder} (the export steps follow)")


def main() -> None:
    parser = argparse.ArgumentParser(description="vitfast demo: checkpoints in, faithful model out")
    parser.add_argument("--out", default="demo-out", help="folder for the checkpoint and calibration images")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="vitfast-demo-") as tmp:
        hf_dir = hf_round_trip(Path(tmp))
        model = vitfast_round_trip(out, hf_dir)
    attention_maps(model)
    calibration_images(out, model.config)


if __name__ == "__main__":
    main()
