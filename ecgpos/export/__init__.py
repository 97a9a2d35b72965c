"""Frozen encoders that leave the lab: one folder with weights, config, model card and test vectors.

format (what the folder holds), load (ExportedEncoder, every check on load), writer (a folder from a
frozen encoder), vectors (test vectors), card (the model card), onnx_export, verify.
"""
