"""Benchmark: `ecgpos predict` throughput in records/s, and the classifier alone in PyTorch and ONNX Runtime.

A classifier export is written the way `ecgpos export --classifier --onnx` writes one, from the
encoder of --config (its own initialisation: weights do not change the cost) with a 9-label head;
its validation and test scores are those of this model on random windows with random labels, so its
thresholds and AUROCs mean nothing. Then, on the CPU with --threads threads:
1. `ecgpos predict` on --records real ecg-arrhythmia sample records (read, screened, preprocessed,
   predicted, written), in-process, the faster of two runs;
2. the classifier alone on the same number of preprocessed windows at --batch: the PyTorch module
   (`ecgpos.load_classifier`) and classifier.onnx in an onnxruntime session, the faster of two runs each.
The last line is the figure.

    python bench/predict.py [--config configs/level0.yaml] [--records 64] [--batch 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ecgpos.cli import main as ecgpos_main  # noqa: E402
from ecgpos.export.classifier import CLASSIFIER_ONNX_FILE, ExportedClassifier, load_classifier  # noqa: E402
from ecgpos.export.classifier_writer import FinetunedModel, write_classifier_export  # noqa: E402
from ecgpos.inference.resolve import random_encoder  # noqa: E402
from ecgpos.resources import sample_data_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["AFIB", "VPC", "NORM", "1AVB", "CRBBB", "STE", "PAC", "CLBBB", "STD"]  # CPSC2018's, as MERL names them


def write_classifier(config: Path, out: Path) -> None:
    """A classifier export of `config`'s encoder with a seeded head, written by the exporter itself."""
    loaded = random_encoder(config, seed=0)
    torch.manual_seed(0)
    head = torch.nn.Linear(loaded.width, len(LABELS)).eval()
    classifier = ExportedClassifier(loaded, head, LABELS, np.full(len(LABELS), 0.5), {})
    rng = np.random.default_rng(0)
    windows = rng.standard_normal((24, 12, loaded.spec.window)).astype(np.float32)
    with torch.no_grad():
        probs = classifier(torch.from_numpy(windows)).numpy().astype(np.float64)
    # as read_scores gives them: the probabilities, and the scores the test AUROC ranks (no logits here)
    scores = {"y_true": (rng.random(probs.shape) < 0.5).astype(np.uint8), "y_score": probs, "ranked": probs}
    state = {f"encoder.{k}": v for k, v in loaded.module.state_dict().items()}
    state.update({f"head.{k}": v for k, v in head.state_dict().items()})
    info = {"encoder_arch": loaded.arch, "task": "bench", "protocol": "random-init", "seed": 0, "windows": 1}
    out.mkdir()
    write_classifier_export(FinetunedModel(out, info, classifier, state, scores, scores), out, onnx=True)


def best_of_two(run) -> float:
    times = []
    for _ in range(2):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config", type=Path, default=ROOT / "configs" / "level0.yaml", help="run config of the encoder"
    )
    parser.add_argument("--records", type=int, default=64, help="ecg-arrhythmia sample records (at most 200)")
    parser.add_argument("--batch", type=int, default=32, help="windows per forward pass")
    parser.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = work / "classifier"
        write_classifier(args.config, model_dir)
        records = work / "records"
        records.mkdir()
        for header in sorted((sample_data_root() / "ecg-arrhythmia").rglob("JS*.hea"))[: args.records]:
            for path in (header, header.with_suffix(".mat")):
                (records / path.name).symlink_to(path.resolve())
        count = len(list(records.glob("*.hea")))
        argv = ["predict", "--model", str(model_dir), "--input", str(records), "--out", str(work / "p.csv")]
        argv += ["--batch-size", str(args.batch), "--no-progress"]
        end_to_end = best_of_two(lambda: ecgpos_main(argv))

        model = load_classifier(model_dir)
        windows = np.random.default_rng(1).standard_normal((count, 12, model.spec.window)).astype(np.float32)
        batches = [windows[i : i + args.batch] for i in range(0, count, args.batch)]

        @torch.no_grad()
        def run_torch() -> None:
            for batch in batches:
                model(torch.from_numpy(batch))

        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(
            str(model_dir / CLASSIFIER_ONNX_FILE), options, providers=["CPUExecutionProvider"]
        )
        name = session.get_inputs()[0].name

        def run_onnx() -> None:
            for batch in batches:
                session.run(None, {name: batch})

        with torch.no_grad():
            gap = np.abs(session.run(None, {name: batches[0]})[0] - model(torch.from_numpy(batches[0])).numpy()).max()
        torch_s, onnx_s = best_of_two(run_torch), best_of_two(run_onnx)
    print(f"config {args.config.name}, {count} records, batch {args.batch}, {args.threads} threads (CPU)")
    print(f"classifier alone: torch {count / torch_s:.1f} rec/s, onnxruntime {count / onnx_s:.1f} rec/s "
          f"(max |diff| {gap:.1e})")  # fmt: skip
    print(
        f"predict: {count / end_to_end:.1f} records/s end to end; classifier alone torch {count / torch_s:.1f}, "
        f"onnxruntime {count / onnx_s:.1f} records/s ({torch_s / onnx_s:.2f}x)"
    )


if __name__ == "__main__":
    main()
