"""`make demo`: the main job as it stands today, end to end on CPU with no downloads.

1. Make a Hugging Face ViT checkpoint (random weights: nothing can be downloaded here) the way a
   user would have one on disk, load it with `vitfast.load_checkpoint`, and compare logits with
   `transformers` itself.
2. Load it again at a higher resolution (position embeddings resized) and compare with HF's
   `interpolate_pos_encoding`.
3. Save a vitfast checkpoint, reload it, check the outputs are bit-identical.
4. Show attention maps from the math path and time the reference model on this CPU.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

import vitfast


def _row(label: str, value: str) -> None:
    print(f"  {label:<50} {value}")


def hf_round_trip(workdir: Path) -> Path | None:
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: skipping the Hugging Face parity step (pip install -e .[test])")
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


def vitfast_round_trip(workdir: Path, source: Path | None) -> vitfast.VisionTransformer:
    print("\n[3] vitfast checkpoint round trip (safetensors, config in the metadata)")
    model = vitfast.load_checkpoint(source) if source else vitfast.create_model("vit_cifar_patch4_32")
    path = vitfast.save_checkpoint(model, workdir / "model.safetensors")
    again = vitfast.load_checkpoint(path)
    x = torch.randn(2, 3, *model.config.img_hw)
    with torch.no_grad():
        same = torch.equal(model(x), again(x))
    _row("saved", f"{path.name} ({path.stat().st_size / 1e6:.1f} MB)")
    _row("reloaded outputs bit-identical", str(same))
    return again


def attention_and_timing(model: vitfast.VisionTransformer) -> None:
    print("\n[4] attention maps (math path) and CPU timing of the reference model")
    x = torch.randn(1, 3, *model.config.img_hw)
    with torch.no_grad():
        _, attns = model.forward_features(x, return_attention=True)
    cls_attn = attns[-1][0, :, 0, 1:].mean(0)  # last layer, head-averaged, class token -> patches
    _row("layers x [B, heads, T, T]", f"{len(attns)} x {list(attns[0].shape)}")
    _row("last-layer class-token attention, max patch", f"{cls_attn.max().item():.3f} (uniform = {1 / cls_attn.numel():.3f})")

    small = vitfast.create_model("vit_small_patch16_224")
    batch = torch.randn(8, 3, 224, 224)
    for label, fused in (("SDPA", True), ("math", False)):
        small.set_fused_attn(fused)
        with torch.inference_mode():
            small(batch)  # warm-up
            times = []
            for _ in range(3):
                start = time.perf_counter()
                small(batch)
                times.append(time.perf_counter() - start)
        best = sorted(times)[len(times) // 2]
        _row(f"ViT-S/16 batch 8 fp32 eager ({label}), median of 3", f"{best * 1e3:.0f} ms = {8 / best:.1f} img/s")
    print("  (a quick look, not a benchmark: `vitfast bench` is still to come)")


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="vitfast-demo-") as tmp:
        workdir = Path(tmp)
        hf_dir = hf_round_trip(workdir)
        model = vitfast_round_trip(workdir, hf_dir)
        attention_and_timing(model)


if __name__ == "__main__":
    main()
