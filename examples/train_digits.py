"""Train a tiny ViT on scikit-learn's 8x8 digits (upsampled to 32x32) on CPU, then inspect it.

    pip install scikit-learn
    python examples/train_digits.py --out digits-run      # 1-2 minutes on an idle 2-core CPU
    vitfast inspect --checkpoint digits-run/digits.safetensors --image digits-run/digit.png

Writes the checkpoint, one held-out test digit as a PNG, and the `vitfast inspect` figures for it,
so you can check the pictures on a model that has learned something: position embeddings with a
row/column structure, rollout on the strokes, attention distance per layer.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import vitfast
from vitfast import inspect as vi


def load_digits_uint8() -> tuple[np.ndarray, np.ndarray]:
    """sklearn digits -> uint8 RGB images [B, 32, 32, 3] (bilinear upsampling of the 0..16 values), labels [B]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.from_numpy(digits.images / 16.0).float()[:, None]  # [B, 1, 8, 8] in [0, 1]
    big = torch.nn.functional.interpolate(small, size=32, mode="bilinear", align_corners=False)
    rgb = (big.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).permute(0, 2, 3, 1)
    return rgb.numpy().copy(), digits.target


def random_shift(x: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Translate each image [B, C, H, W] by up to `pad` pixels (edge padding), a mild augmentation."""
    B, _, H, W = x.shape
    padded = torch.nn.functional.pad(x, (pad,) * 4, mode="replicate")
    dy, dx = torch.randint(0, 2 * pad + 1, (2, B))
    return torch.stack([padded[i, :, dy[i] : dy[i] + H, dx[i] : dx[i] + W] for i in range(B)])


def train(model, x_train, y_train, x_test, y_test, epochs: int, batch: int = 128) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    steps = epochs * ((len(x_train) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    start = time.time()
    for epoch in range(epochs):
        model.train()
        for idx in torch.randperm(len(x_train)).split(batch):
            loss = torch.nn.functional.cross_entropy(model(random_shift(x_train[idx])), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if (epoch + 1) % 10 == 0 or epoch + 1 == epochs:
            model.eval()
            with torch.no_grad():
                acc = (model(x_test).argmax(-1) == y_test).float().mean().item()
            print(f"epoch {epoch + 1:3d}  loss {loss.item():.3f}  test top-1 {acc:.3f}  ({time.time() - start:.0f} s)")
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="digits-run", help="folder for the checkpoint, the digit PNG and the figures")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--index", type=int, default=0, help="which held-out digit to inspect")
    args = parser.parse_args()
    torch.manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model = vitfast.create_model("vit_cifar_patch4_32")
    images, labels = load_digits_uint8()
    x = vitfast.preprocess(images, model.config)
    y = torch.from_numpy(labels)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    test, tr = perm[:300], perm[300:]
    train(model, x[tr], y[tr], x[test], y[test], args.epochs)

    ckpt = vitfast.save_checkpoint(model, out / "digits.safetensors")
    digit = out / "digit.png"
    Image.fromarray(images[test[args.index]]).save(digit)
    result = vi.inspect_model(model, vitfast.preprocess(vi.load_image(digit), model.config))
    paths = vi.save_figures(result, out / "inspect", overwrite=True)
    print(f"label {labels[test[args.index]]}; wrote {ckpt}, {digit} and {', '.join(str(p) for p in paths.values())}")
    # Attention distance is noisy on one image; over the whole test set it is the paper's statistic.
    with torch.no_grad():
        _, attns = model.forward_features(x[test], return_attention=True)
    dist = vi.mean_attention_distance(attns, model.config)
    for layer, row in enumerate(dist.tolist(), start=1):
        print(f"layer {layer}: mean attention distance over {len(test)} test digits " + " ".join(f"{d:5.1f}" for d in row))


if __name__ == "__main__":
    main()
