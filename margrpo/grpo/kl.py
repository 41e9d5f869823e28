"""KL penalties between the policy and a frozen reference, per recorded diffusion transition.

With a fixed-variance sampler (fixed_small / fixed_large, flow SDE) both policies are Gaussians with
the same std at a recorded step, so the exact KL is ||mu - mu_ref||^2 / (2 std^2) summed over
channels. With learned-range variance (Harmon) the std also depends on z; `gaussian_kl` then uses the
rollout's recorded std for both, which drops the variance term of the KL (use k3_logp for an
estimator that sees both).
"""
from __future__ import annotations

import torch

KL_TYPES = ("gaussian", "k3_logp", "parity_mean_k3")


def gaussian_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Closed-form KL(N(mean, std^2) || N(ref_mean, std^2)) summed over the last (channel) dim."""
    diff = (mean.float() - ref_mean.float()) / std.float()
    return 0.5 * diff.pow(2).sum(-1)


def k3_logp(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref) from log-probs of policy samples (>= 0)."""
    d = ref_logp.float() - logp.float()
    return torch.expm1(d) - d


def parity_mean_k3(mean: torch.Tensor, ref_mean: torch.Tensor) -> torch.Tensor:
    """The reference code's penalty: exp(d) - d - 1 on the difference of Gaussian MEANS (no 1/std^2),
    averaged over channels. Not a KL; kept only for the `parity` preset."""
    d = ref_mean.float() - mean.float()
    return (torch.expm1(d) - d).mean(-1)


def kl_penalty(kind: str, *, mean=None, ref_mean=None, std=None, logp=None, ref_logp=None) -> torch.Tensor:
    """Dispatch by config name; returns a per-transition penalty with the shape of logp / mean[..., 0]."""
    if kind == "gaussian":
        return gaussian_kl(mean, ref_mean, std)
    if kind == "k3_logp":
        return k3_logp(logp, ref_logp)
    if kind == "parity_mean_k3":
        return parity_mean_k3(mean, ref_mean)
    raise ValueError(f"kl_type: got {kind!r}, expected one of {', '.join(KL_TYPES)}")
