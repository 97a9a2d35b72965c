"""Frozen encoders that leave the lab: one folder with weights, config, model card and test vectors.

format (what the folder holds), load (ExportedEncoder, every check on load), writer (a folder from a
frozen encoder), vectors (test vectors), card (the model card), probe_scores (a probe folder's test
scores, checked before its results enter the card), decoders (`--with-decoders`), onnx_export, verify.
"""
