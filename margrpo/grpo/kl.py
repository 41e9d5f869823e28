"""KL penalties between the policy and a frozen ref policy, per recorded diffusion transition.

With a fixed-variance sampler (fixed_small / fixed_large, flow SDE) both policies are Gaussians with
the same std at a recorded step, so the exact KL is ||mu - mu_ref||^2 / (2 std^2) summed over
channels. With learned-range variance (Harmon) the std also depends on z; `gaussian_kl` then uses the
std of the policy term's Gaussians (margrpo.grpo.policy_update.loss_std: the recorded std, or the
constant of likelihood_std recorded_main) for both, which drops the variance term of the KL (use
k3_logp with likelihood_std policy for an estimator that sees both).

channel_reduction says how a transition's per-channel values become one number, and must match the
policy term's (margrpo.grpo.objective): "sum" (a token's log-likelihood; the default, and the Harmon
reference) or "mean" (the NOVA reference's mean over latent elements). The per-channel kinds
(gaussian, parity_mean_k3) reduce their channels that way; k3_logp receives log-probs the caller has
already reduced.
"""

from __future__ import annotations

import torch

KL_TYPES = ("gaussian", "k3_logp", "parity_mean_k3")
CHANNEL_REDUCTIONS = ("sum", "mean")


def _reduce(per_channel: torch.Tensor, channel_reduction: str) -> torch.Tensor:
    if channel_reduction == "sum":
        return per_channel.sum(-1)
    if channel_reduction == "mean":
        return per_channel.mean(-1)
    raise ValueError(f"channel_reduction: got {channel_reduction!r}, expected one of {', '.join(CHANNEL_REDUCTIONS)}")


def gaussian_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor, channel_reduction: str = "sum") -> torch.Tensor:
    """Closed-form KL(N(mean, std^2) || N(ref_mean, std^2)), per channel reduced over the last dim."""
    diff = (mean.float() - ref_mean.float()) / std.float()
    return _reduce(0.5 * diff.pow(2), channel_reduction)


def k3_logp(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref) from log-probs of policy samples (>= 0)."""
    d = ref_logp.float() - logp.float()
    return torch.expm1(d) - d


def parity_mean_k3(mean: torch.Tensor, ref_mean: torch.Tensor, channel_reduction: str = "sum") -> torch.Tensor:
    """The reference code's penalty: exp(d) - d - 1 on the difference of Gaussian MEANS (no 1/std^2),
    per channel, reduced over the last dim. Not a KL; kept only for the `parity` presets."""
    d = ref_mean.float() - mean.float()
    return _reduce(torch.expm1(d) - d, channel_reduction)


def kl_penalty(kind: str, *, mean=None, ref_mean=None, std=None, logp=None, ref_logp=None, channel_reduction: str = "sum") -> torch.Tensor:
    """Dispatch by config name; returns a per-transition penalty with the shape of logp / mean[..., 0]."""
    if kind == "gaussian":
        return gaussian_kl(mean, ref_mean, std, channel_reduction)
    if kind == "k3_logp":
        return k3_logp(logp, ref_logp)
    if kind == "parity_mean_k3":
        return parity_mean_k3(mean, ref_mean, channel_reduction)
    raise ValueError(f"kl_type: got {kind!r}, expected one of {', '.join(KL_TYPES)}")
