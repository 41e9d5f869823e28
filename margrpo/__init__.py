"""margrpo: fused ops and a thin GRPO trainer for MAR (masked autoregressive + diffusion head) models."""

__version__ = "0.1.0"
