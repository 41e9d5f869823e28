"""The GRPO algorithm's configuration: the `grpo` section of a trainer config, read by
margrpo.grpo.update (and by the trainer for what happens around the update)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class LoRAConfig:
    """LoRA adapters (peft) as the ONLY trainable parameters; the KL reference is then the policy with
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
    drop_zero_variance: bool = False  # drop groups whose rewards are all equal (no signal)
    objective: Literal["clip", "reinforce"] = "clip"  # reinforce: the reference code's value-A/grad-A*dlogp
    clip_eps: float = 0.2
    clip_eps_high: Optional[float] = None
    inner_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch
    micro_batches: int = 1  # gradient accumulation: each minibatch in this many pieces (memory), one update
    micro_batch_over: Literal["images", "mask_steps"] = "images"
    minibatch_over: Literal["images", "mask_steps"] = "images"  # mask_steps: the reference's per-step updates
    aggregation: Literal["token_mean", "sample_mean"] = "token_mean"
    kl_beta: float = 0.01
    kl_type: Literal["gaussian", "k3_logp", "parity_mean_k3"] = "gaussian"
    head: Literal["frozen", "train", "low_lr"] = "frozen"
    head_lr_scale: float = 0.1  # for head: low_lr
    mte: bool = False  # multi-trajectory expectation on the most uncertain tokens (needs rollout.num_seeds >= 2)
    mte_ratio: float = 0.3
    mte_pixels_per_token: int = 1  # > 1 ranks latent pixels (NOVA reference behaviour)
    consistency: bool = False  # consistency-aware selection (needs rollout.likelihood_positions: unknown)
    consistency_threshold: float = 0.0
    consistency_start_step: int = 2  # effective mask-step index from which it applies (third step)
    likelihood_cfg: Literal["rollout", "none"] = "rollout"  # none: the reference code's unguided likelihood
    lora: LoRAConfig = field(default_factory=LoRAConfig)
