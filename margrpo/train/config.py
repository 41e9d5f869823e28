"""The trainer's typed configuration (one YAML file of sections + `key=value` overrides).

Sections: backbone (which model and checkpoint: margrpo.models.BackboneConfig), rollout
(margrpo.rollout.RolloutConfig), grpo (the algorithm and its ablation switches:
margrpo.grpo.GRPOConfig), optim, rewards (name -> weight or options), run (steps, seeds, output,
checkpoints, evaluation). `pretrain` belongs to the pretraining job and is carried through unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from margrpo.config import ConfigError, apply_overrides, from_dict, load_yaml
from margrpo.grpo.config import GRPOConfig, LoRAConfig  # noqa: F401  (part of this module's API)
from margrpo.models.config import BackboneConfig, check_no_model_section
from margrpo.rollout import RolloutConfig


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    grad_clip: float = 1.0
    bf16: bool = False  # autocast the likelihood forward in bf16 (CUDA)


@dataclass
class RunConfig:
    steps: int = 100
    seed: int = 0
    out_dir: str = "runs/shapes-tiny"
    device: str = "auto"  # auto: cuda when available, else cpu
    train_prompts: Optional[str] = None  # a prompt file; None: the ShapesWorld train split
    # how a step draws its prompts: uniform over the prompt list, or category (ShapesWorld prompts
    # only): a uniform category first, then a uniform prompt of it, so every category trains equally
    # often whatever its share of the list (the train split is 81% spatial prompts)
    train_prompt_mix: Literal["uniform", "category"] = "uniform"
    eval_prompts: Optional[str] = None  # None: the ShapesWorld held-out split
    eval_every: int = 20
    eval_per_category: int = 4  # held-out prompts per category (balanced) when eval_prompts is None
    eval_samples_per_prompt: int = 2
    eval_seed: int = 1234  # fixed seeds so evaluation points are comparable
    save_every: int = 50
    keep_last: int = 2
    resume: Literal["auto", "never"] = "auto"
    max_bad_steps: int = 5  # consecutive skipped (non-finite) steps before stopping
    log_every: int = 1
    tensorboard: bool = True
    wandb: bool = False
    threads: Optional[int] = None  # torch CPU threads (None: torch's default)
    # data parallelism under torchrun: ddp (replicated weights, gradients all-reduced) or fsdp2
    # (trainable modules sharded with torch.distributed.fsdp.fully_shard); one process: no difference
    parallel: Literal["ddp", "fsdp2"] = "ddp"


@dataclass
class TrainerConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rewards: dict[str, Any] = field(default_factory=lambda: {"shapes": 1.0})
    run: RunConfig = field(default_factory=RunConfig)
    pretrain: dict[str, Any] = field(default_factory=dict)  # margrpo pretrain's section, carried through

    def __post_init__(self) -> None:
        g = self.grpo
        if g.group_size < 2:
            raise ConfigError(f"grpo.group_size: got {g.group_size}, expected >= 2 (advantages compare samples)")
        if not 0 < g.mte_ratio <= 1:
            raise ConfigError(f"grpo.mte_ratio: got {g.mte_ratio}, expected a ratio in (0, 1]")
        if g.mte and self.rollout.num_seeds < 2:
            raise ConfigError(
                f"grpo.mte: true needs rollout.num_seeds >= 2 (got {self.rollout.num_seeds}): the uncertainty "
                "is the std over seed trajectories; set rollout.num_seeds or grpo.mte=false"
            )
        if g.consistency and self.rollout.likelihood_positions != "unknown":
            raise ConfigError(
                "grpo.consistency: true needs rollout.likelihood_positions: unknown (with 'revealed' every "
                "transition is a committed token, which consistency always keeps); set one or the other"
            )
        for name in ("inner_epochs", "minibatches", "micro_batches", "prompts_per_step", "pixels_per_token"):
            if getattr(g, name) < 1:
                raise ConfigError(f"grpo.{name}: got {getattr(g, name)}, expected >= 1")
        if g.mte_random_positions < 0:
            raise ConfigError(f"grpo.mte_random_positions: got {g.mte_random_positions}, expected >= 0")
        lora = g.lora
        if lora.rank < 0:
            raise ConfigError(f"grpo.lora.rank: got {lora.rank}, expected >= 0 (0 turns LoRA off)")
        if not 0 <= lora.dropout < 1:
            raise ConfigError(f"grpo.lora.dropout: got {lora.dropout}, expected a probability in [0, 1)")
        if lora.rank and g.head != "frozen":
            raise ConfigError(
                f"grpo.lora.rank: {lora.rank} trains LoRA adapters only, which needs grpo.head: frozen "
                f"(got {g.head!r}); the reference policy is the base weights with the adapters disabled"
            )
        if self.run.steps < 0:
            raise ConfigError(f"run.steps: got {self.run.steps}, expected >= 0")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainerConfig:
    """TrainerConfig from a YAML file (or the defaults when path is None) and dotted overrides."""
    data = apply_overrides(load_yaml(path) if path is not None else {}, list(overrides))
    check_no_model_section(data)
    return from_dict(TrainerConfig, data)
