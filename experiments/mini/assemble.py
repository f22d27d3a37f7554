"""Assemble a trained run's output (possibly sharded, without tokenizer files, as returned from the
GPU machine) into the shipped checkpoint folder: one bf16 model.safetensors, config,
generation config, tokenizer (rebuilt in code, deterministic), train_log.csv and metrics.json.

    python -m experiments.mini.assemble --src /work/.device/<n> --dst models/mini
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from experiments.mini.tokenizer import build_tokenizer

COPIED = ["config.json", "generation_config.json", "train_log.csv", "metrics.json"]


def merge_weights(src: Path, dst: Path) -> int:
    """Write dst/model.safetensors from src's single file or shards; returns its size in bytes."""
    index = src / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(load_file(src / name))
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return (dst / "model.safetensors").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", default="models/mini")
    args = ap.parse_args()
    src, dst = Path(args.src), Path(args.dst)
    dst.mkdir(parents=True, exist_ok=True)
    for stale in dst.glob("model*.safetensors*"):
        stale.unlink()
    size = merge_weights(src, dst)
    for name in COPIED:
        shutil.copyfile(src / name, dst / name)
    build_tokenizer().save_pretrained(dst)
    metrics_path = dst / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics["checkpoint_bytes"] = size
    metrics["checkpoint_dir_bytes"] = sum(f.stat().st_size for f in dst.iterdir() if f.is_file())
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"{dst}: model.safetensors {size / 1e6:.2f} MB, folder {metrics['checkpoint_dir_bytes'] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
