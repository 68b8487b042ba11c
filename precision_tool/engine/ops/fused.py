"""Fused kernels: registered by the fusion workstream."""
