"""Inference backends: ONNX Runtime on CPU (default) and TensorRT on GPU (optional extra)."""
