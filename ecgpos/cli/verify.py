"""`ecgpos verify DIR`: check an installation and an export folder against its own test vectors.

DIR is an encoder or a classifier export folder (`ecgpos export`), or hf://ORG/NAME[@REVISION].

Checks, each printed as PASS/FAIL: the weights load and match config.json's sha256 and
architecture; forward_features of the stored inputs; `embed` of the stored raw record (preprocessing
and lead mapping); encoder.onnx on the stored inputs when present (SKIP without onnxruntime);
a classifier's probabilities of the stored inputs (and classifier.onnx's); decoders.safetensors
when present (`--with-decoders`: hash, settings, strict load); the model card README.md, and the
.onnx file when config.json lists it, must be present.
Exit 0 when all pass, 1 when any fails, 2 when DIR is not an export folder at all.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ecgpos.export.hub import model_ref
from ecgpos.export.verify import verify


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecgpos verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=model_ref, help="export folder (ecgpos export) or hf://ORG/NAME[@REVISION]")
    parser.add_argument("--device", default="cpu", help="torch device to run the vectors on")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    passed, lines = verify(args.folder, args.device)
    for line in lines:
        print(line)
    print(f"{'PASS' if passed else 'FAIL'}: {args.folder}")
    return 0 if passed else 1
