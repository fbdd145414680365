"""Triton kernels for quantized ops, each paired with a readable PyTorch reference."""
