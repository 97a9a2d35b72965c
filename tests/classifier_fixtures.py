"""A fine-tune output folder as `ecgpos finetune --out` writes it, built from real parts: the tiny
Level-0 encoder (its own initialisation), a linear head trained on its features of real
ecg-arrhythmia records for three rhythm labels from their headers, and the validation and test
probabilities of that model on held-out records. Also a plain encoder export of the same encoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.export.format import weights_hash
from ecgpos.export.writer import write_export
from ecgpos.inference.resolve import random_encoder
from ecgpos.models.features import embed_signal

ROOT = Path(__file__).resolve().parents[1]
# SNOMED codes of the ecg-arrhythmia headers' #Dx line, in head order
LABELS = {"SB": "426177001", "AFIB": "164889003", "SR": "426783006"}
RECORDS = 120  # 60 train, 30 validation, 30 test


def _records(data: Path) -> tuple[list[str], np.ndarray, list[np.ndarray], object]:
    loaded = random_encoder(ROOT / "configs" / "tiny" / "level0.yaml", seed=3)
    ids, labels, feats = [], [], []
    for header in sorted((data / "ecg-arrhythmia").rglob("*.hea"))[:RECORDS]:
        raw = read_wfdb_record(header.with_suffix(""))
        dx = " ".join(c for c in raw.comments if c.startswith("Dx"))
        try:
            feats.append(embed_signal(loaded.module, raw.signal, raw.fs, raw.leads, loaded.spec))
        except SignalError:
            continue
        ids.append(header.stem)
        labels.append([code in dx for code in LABELS.values()])
    return ids, np.array(labels, dtype=np.uint8), feats, loaded


def _train_head(x: np.ndarray, y: np.ndarray) -> torch.nn.Linear:
    torch.manual_seed(0)
    head = torch.nn.Linear(x.shape[1], y.shape[1])
    optimiser = torch.optim.Adam(head.parameters(), lr=0.05)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y.astype(np.float32))
    for _ in range(300):
        optimiser.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(head(xs), ys).backward()
        optimiser.step()
    return head.eval()


def write_finetune_out(data: Path, out: Path) -> dict:
    """OUT/models/arrhythmia-rhythm/1/seed{0,1}/... plus an encoder export at OUT.parent/encoder-export.
    Returns {"out", "encoder_export", "head" (seed 0), "encoder"}."""
    ids, labels, feats, loaded = _records(data)
    x = np.stack(feats).astype(np.float32)
    train, val, test = slice(0, 60), slice(60, 90), slice(90, None)
    mean, std = x[train].mean(0), x[train].std(0) + 1e-6
    for seed in (0, 1):
        head = _train_head((x[train] - mean) / std, labels[train])
        # fold the standardisation into the head: logits = W (f - mean) / std + b
        with torch.no_grad():
            weight = head.weight / torch.from_numpy(std)
            bias = head.bias - weight @ torch.from_numpy(mean)
            head.weight.copy_(weight)
            head.bias.copy_(bias)
            if seed == 1:  # a worse seed on validation: export picks seed 0 without --seed
                head.bias.add_(torch.tensor([3.0, -3.0, 3.0]))
                head.weight.mul_(-1)
        folder = out / "models" / "arrhythmia-rhythm" / "1" / f"seed{seed}"
        folder.mkdir(parents=True)
        state = {f"encoder.{k}": v.contiguous() for k, v in loaded.module.state_dict().items()}
        state.update({"head.weight": head.weight.detach().contiguous(), "head.bias": head.bias.detach().contiguous()})
        save_file(state, str(folder / "model.safetensors"))
        with torch.no_grad():
            probs = torch.sigmoid(head(torch.from_numpy(x))).numpy()
        for split, rows in (("val", val), ("test", test)):
            np.savez(
                folder / f"{split}_scores.npz",
                y_true=labels[rows],
                y_score=probs[rows].astype(np.float32),
                records=np.array(ids[rows]),
                labels=np.array(list(LABELS)),
            )
        from ecgpos.metrics import auroc_columns

        val_auroc = float(np.nanmean(auroc_columns(probs[val], labels[val])))
        info = {
            "format": "ecgpos-classifier",
            "version": 1,
            "encoder_arch": loaded.arch,
            "preprocess": loaded.spec.to_dict(),
            "pooling": "mean of patch tokens then final norm; mean over a record's windows",
            "windows": 1,
            "labels": list(LABELS),
            "task": "arrhythmia-rhythm",
            "fraction": 1.0,
            "seed": seed,
            "protocol": "finetune-top:0",
            "selected_epoch": 1,
            "val_macro_auroc": val_auroc,
            "test_macro_auroc": float(np.nanmean(auroc_columns(probs[test], labels[test]))),
            "encoder_source": {
                "path": "random:configs/tiny/level0.yaml",
                "weights_sha256": weights_hash(loaded.module),
            },
            "output": "logits; sigmoid for probabilities",
        }
        (folder / "model.json").write_text(json.dumps(info, indent=2))
        if seed == 0:
            head0 = head
    encoder_export = out.parent / "encoder-export"
    encoder_export.mkdir()
    write_export(loaded.module, loaded.spec, loaded.arch, {"name": "tiny-random"}, encoder_export)
    return {"out": out, "encoder_export": encoder_export, "head": head0, "encoder": loaded}


def hub_cache(cache: Path, repo_id: str, folder: Path, commit: str = "a" * 40) -> str:
    """Lay `folder`'s files out in the Hub cache as huggingface_hub does: blobs named by content,
    snapshots/<commit>/ holding links to them, refs/main naming the commit. Returns the commit."""
    import hashlib
    import os

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return commit
