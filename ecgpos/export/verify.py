"""The checks behind `ecgpos verify`: an export folder against its own test vectors.

The list of checks and the exit codes are the command's help text, in ecgpos/cli/verify.py.
"""

from __future__ import annotations

from pathlib import Path

from ecgpos.errors import EcgposError
from ecgpos.export.format import CARD_FILE, CLASSIFIER_FORMAT, CONFIG_FILE, FORMAT, ONNX_FILE, VECTORS_FILE
from ecgpos.export.load import export_folder, load_encoder, read_export_config
from ecgpos.export.vectors import ATOL, RTOL, compare, load_vectors, run_probabilities, run_vectors
from ecgpos.models.features import resolve_device


def _line(ok: bool | None, what: str, detail: str) -> str:
    status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    return f"{status} {what}: {detail}"


def verify(folder: Path, device: str = "cpu") -> tuple[bool, list[str]]:
    """(all passed, report lines). Raises EcgposError only when `folder` is not an export or
    `device` is unusable (neither is a failed check of the export)."""
    resolve_device(device)
    folder = export_folder(folder)
    config = read_export_config(folder, (FORMAT, CLASSIFIER_FORMAT))
    classifier = config["format"] == CLASSIFIER_FORMAT
    lines = []
    try:
        if classifier:  # a classifier: its encoder checked as an encoder export's, then its probabilities
            from ecgpos.export.classifier import CLASSIFIER_ONNX_FILE, load_classifier

            encoder = load_classifier(folder, device=device)
        else:
            encoder = load_encoder(folder, device=device)
    except EcgposError as err:
        return False, [_line(False, "weights", str(err))]
    onnx_file, onnx_output = (CLASSIFIER_ONNX_FILE, "probabilities") if classifier else (ONNX_FILE, "features")
    lines.append(
        _line(
            True,
            "weights",
            f"sha256 {config['weights_sha256'][:16]}... matches, architecture "
            f"{config['arch'].get('kind')} loaded strictly",
        )
    )
    try:
        vectors = load_vectors(folder / VECTORS_FILE)
        results = run_vectors(encoder, vectors)
        if classifier:
            results["probabilities"] = run_probabilities(encoder, vectors)
    except EcgposError as err:
        return False, lines + [_line(False, "test vectors", str(err))]
    labels = {
        "features": f"forward_features of {len(vectors['inputs'])} stored inputs",
        "embed": "embed of the stored raw record (preprocessing, lead mapping)",
        "probabilities": f"probabilities of the {len(vectors['inputs'])} stored inputs (encoder and head)",
    }
    for key, res in results.items():
        lines.append(
            _line(
                res["ok"],
                labels[key],
                res["detail"]
                or f"max abs diff {res['max_abs']:.2e}, max rel diff {res['max_rel']:.2e} "
                f"(within atol {ATOL:g} + rtol {RTOL:g} x |expected|)",
            )
        )
    stated = config.get("test_vectors") if isinstance(config.get("test_vectors"), dict) else {}
    if {k: stated.get(k) for k in ("atol", "rtol")} not in ({"atol": ATOL, "rtol": RTOL}, {"atol": None, "rtol": None}):
        lines.append(  # descriptive and outside the config hash: an edit there must not loosen the check
            f"NOTE {CONFIG_FILE}: test_vectors states atol {stated.get('atol')!r}, rtol {stated.get('rtol')!r}; "
            f"verify applies its own, atol {ATOL:g} and rtol {RTOL:g}"
        )
    passed = all(res["ok"] for res in results.values())
    if "decoders" in config:  # `score` refuses decoders that do not load: so does verify
        from ecgpos.export.decoders import DECODERS_FILE, load_decoders

        try:
            levels = ", ".join(load_decoders(folder, config))
            if not levels:  # `score` would find no level to score
                raise EcgposError("config.json's decoders entry names no level (level0, level1, ...)")
            lines.append(_line(True, DECODERS_FILE, f"sha256 matches, levels {levels} loaded strictly"))
        except EcgposError as err:
            lines.append(_line(False, DECODERS_FILE, str(err)))
            passed = False
    if not (folder / CARD_FILE).is_file():  # the card holds the intended use and limitations: it travels along
        lines.append(_line(False, CARD_FILE, f"the model card is missing from {folder}; copy the whole export folder"))
        passed = False
    if "onnx" in config and not (folder / onnx_file).is_file():  # exported with --onnx, the file since lost
        lines.append(_line(False, onnx_file, f"{CONFIG_FILE} lists it but {folder / onnx_file} is missing"))
        passed = False
    if (folder / onnx_file).is_file():
        try:
            from ecgpos.export.onnx_export import onnx_features

            res = compare(vectors[onnx_output], onnx_features(folder / onnx_file, vectors["inputs"]))
            lines.append(_line(res["ok"], onnx_file, res["detail"] or f"max abs diff {res['max_abs']:.2e}"))
            passed &= res["ok"]
        except EcgposError as err:  # optional dependency missing: say so, do not fail the weights
            lines.append(_line(None, onnx_file, str(err)))
        except Exception as err:  # a corrupt .onnx file makes onnxruntime raise its own types
            lines.append(_line(False, onnx_file, f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"))
            passed = False
    return passed, lines
