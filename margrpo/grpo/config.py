"""The GRPO algorithm's configuration: the `grpo` section of a trainer config, read by
margrpo.grpo.update (and by the trainer for what happens around the update)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class LoRAConfig:
    """LoRA adapters (peft) as the ONLY trainable parameters; the KL's ref policy is then the policy with
    its adapters disabled (the base weights), so no second copy of the model is kept. rank 0: off."""

    rank: int = 0
    alpha: Optional[float] = None  # None: 2 * rank (Harmon's convention)
    dropout: float = 0.0
    # regular expressions over module names (full match) choosing the nn.Linear layers to adapt;
    # empty: every nn.Linear whose weight GRPO would otherwise train (outside the diffusion head)
    targets: list[str] = field(default_factory=list)


@dataclass
class GRPOConfig:
    """The algorithm. Every MAR-GRPO mechanism is a switch so the paper's ablation can be run."""

    group_size: int = 4  # G samples per prompt
    prompts_per_step: int = 8
    advantage: Literal["group", "batch_std", "no_std", "tracker"] = "group"
    advantage_eps: float = 1e-4
    # the group (or batch) std of the advantages: population (1/G) or unbiased (1/(G-1), the reference code)
    advantage_std: Literal["population", "unbiased"] = "population"
    # drop groups whose rewards are all equal (no signal) from the policy term and its token-weight
    # normaliser, in every advantage mode (the KL still covers them)
    drop_zero_variance: bool = False
    # common: the samples of a group share their mask order and all noise except the recorded
    # transitions' (common random numbers), so reward differences inside a group come from what the
    # likelihood scores; independent: every sample draws its own (the reference code); antithetic:
    # common, and the recorded noise of every second sample is its neighbour's negated (mirrored pairs)
    group_noise: Literal["independent", "common", "antithetic"] = "independent"
    objective: Literal["clip", "reinforce"] = "clip"  # reinforce: the reference code's value-A/grad-A*dlogp
    clip_eps: float = 0.2
    clip_eps_high: Optional[float] = None
    inner_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch
    micro_batches: int = 1  # gradient accumulation: each minibatch in this many pieces (memory), one update
    micro_batch_over: Literal["images", "mask_steps"] = "images"
    minibatch_over: Literal["images", "mask_steps"] = "images"  # mask_steps: the reference's per-step updates
    aggregation: Literal["token_mean", "sample_mean"] = "token_mean"
    # token weights (and the KL's) sum to 1 over the whole rollout batch, or within each optimizer
    # update (the reference's per-mask-step normalisation, with minibatch_over: mask_steps)
    normalization: Literal["batch", "update"] = "batch"
    # a position's per-channel log-probs and KL: summed (its log-likelihood) or averaged (the NOVA
    # reference's element mean); the two terms always use the same reduction
    channel_reduction: Literal["sum", "mean"] = "sum"
    kl_beta: float = 0.01
    kl_type: Literal["gaussian", "k3_logp", "parity_mean_k3"] = "gaussian"
    # every this many steps (skipped ones included) the KL's ref policy becomes a copy of the policy; 0: never
    ref_refresh_every: int = 0
    head: Literal["frozen", "train", "low_lr"] = "frozen"
    head_lr_scale: float = 0.1  # for head: low_lr
    mte: bool = False  # multi-trajectory expectation on the most uncertain tokens (needs rollout.num_seeds >= 2)
    mte_ratio: float = 0.3
    mte_include_rollout: bool = True  # MTE positions average all K+1 trajectories; false: the K seeds only (reference)
    mte_k: Literal["floor", "reference"] = "floor"  # floor(ratio * N) positions, or the reference's max(1, int(ratio * N))
    mte_random_positions: int = 0  # extra uniformly drawn MTE positions per image (the NOVA reference ORs in 1)
    # > 1: top-k, consistency and the policy term work per latent pixel, a token's channels being P
    # pixels (NOVA reference: 4 pixels of 4 channels per 16-channel token); the KL stays per token
    pixels_per_token: int = 1
    consistency: bool = False  # consistency-aware selection (needs rollout.likelihood_positions: unknown)
    consistency_threshold: float = 0.0
    consistency_start_step: int = 2  # effective mask-step index from which it applies (third step)
    # how a rollout's tokens are scored: transition (the Gaussian log-probs of recorded denoising
    # transitions of the rollout's own chain and its seed chains) or matching (the frozen head's
    # denoising loss on forward-noised draws of each committed token: margrpo.grpo.matching)
    estimator: Literal["transition", "matching"] = "transition"
    matching_draws: int = 4  # matching: (time, noise) draws per committed token
    # matching: the fraction [start, stop) of the head's training times the draws cover (0 = clean)
    matching_times: list[float] = field(default_factory=lambda: [0.0, 1.0])
    likelihood_cfg: Literal["rollout", "none"] = "rollout"  # none: the reference code's unguided likelihood
    # the std of the training Gaussians: the current policy's (learned-range: a function of z, with
    # gradient), or recorded_main: the std trajectory 0 was sampled with (Rollout.sampled_std under the
    # post-step known mask, else the recorded std) as a constant for every trajectory (the Harmon
    # reference). Equal for fixed-variance samplers.
    likelihood_std: Literal["policy", "recorded_main"] = "policy"
    lora: LoRAConfig = field(default_factory=LoRAConfig)
