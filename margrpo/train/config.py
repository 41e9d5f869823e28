"""The trainer's typed configuration (one YAML file of sections + `key=value` overrides).

Sections: backbone (which model and checkpoint: margrpo.models.BackboneConfig), rollout
(margrpo.rollout.RolloutConfig), grpo (the algorithm and its ablation switches:
margrpo.grpo.GRPOConfig), optim, rewards (name -> weight or options), run (steps, seeds, output,
checkpoints, evaluation). `pretrain` belongs to the pretraining job and is carried through unchanged.

RULES is the table of valid values of every trainer key (the rollout section's own are
margrpo.rollout.config.RULES); a TrainerConfig checks it when built, so a value that would train in
the wrong direction, be ignored, or fail after work began is an error at load time that names its
key. docs/CONFIG.md states the same ranges (tests/test_config_rules.py holds the two together).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import torch

from margrpo.config import ConfigError  # noqa: F401  (part of this module's API)
from margrpo.config import Rule, apply_overrides, check_rules, finite, from_dict, load_config_file
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
    grad_clip: Optional[float] = 1.0  # max gradient norm per optimizer step; None (or .inf): no clipping
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
    flat_reward_warn_steps: int = 10  # warn when a reward gives no within-group variance this many steps in a row
    log_every: int = 1
    tensorboard: bool = True
    wandb: bool = False
    threads: Optional[int] = None  # torch CPU threads (None: torch's default)
    # data parallelism under torchrun: ddp (replicated weights, gradients all-reduced) or fsdp2
    # (trainable modules sharded with torch.distributed.fsdp.fully_shard); one process: no difference
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    # an exponential moving average of the trainable weights, updated after every applied update
    # (ema = decay * ema + (1 - decay) * weights); 0: off. eval_ema: the held-out evaluation uses it
    ema_decay: float = 0.0
    eval_ema: bool = False


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
        check_rules(self, RULES)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainerConfig:
    """TrainerConfig from a YAML file (or the defaults when path is None) and dotted overrides."""
    data = load_config_file(path, overrides) if path is not None else apply_overrides({}, list(overrides))
    check_no_model_section(data)
    return from_dict(TrainerConfig, data)


MAX_SEED = 2**32  # seeds (and a step's prompt-draw seed, seed * 1_000_003 + step) stay within torch's int64
MAX_THREADS = 1024


def _integer(value, low: int, high: float = float("inf")) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _optional_integer(low: int):
    return lambda v, c: v is None or _integer(v, low)


def _at_least(low: int):
    return lambda v, c: _integer(v, low)


def _regexes(patterns) -> bool:
    try:
        for pattern in patterns:
            re.compile(pattern)
    except (re.error, TypeError):
        return False
    return True


def _device(name: str) -> bool:
    if name == "auto":
        return True
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return False
    return True


def _reward_entry(entry) -> bool:
    """A weight, or a mapping of options whose weight (if given) is a finite number."""
    if isinstance(entry, dict):
        return "weight" not in entry or finite(entry["weight"])
    return finite(entry)


def reward_weight(entry) -> float:
    """The weight of a `rewards` entry (a mapping without one weighs 1, as build_rewards reads it)."""
    return float(entry.get("weight", 1.0)) if isinstance(entry, dict) else float(entry)


def _path(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def reward_weight_notes(rewards: dict) -> list[str]:
    """What the weights of a valid `rewards` mapping do that may surprise (accepted by design; the
    trainer prints these when it starts): a term of weight 0 is scored and logged but not trained on,
    and weights summing to 0 make the total a difference of rewards."""
    weights = {name: reward_weight(entry) for name, entry in rewards.items()}
    notes = [
        f"rewards.{name}: weight 0: scored and logged, but it does not enter the training reward"
        for name, w in weights.items()
        if w == 0 and any(weights.values())
    ]
    if any(weights.values()) and sum(weights.values()) == 0:
        notes.append(
            "rewards: the weights sum to 0, so the total is a difference of rewards (its advantages are "
            "normalised per group; with grpo.advantage no_std their scale is the terms' own)"
        )
    return notes


# beyond this the advantages (reward differences / (std + eps)) shrink towards 0 for any reward of unit scale
MAX_ADVANTAGE_EPS = 1.0


RULES = (
    # backbone (name: a registered backbone, checked by BackboneConfig)
    Rule("backbone.checkpoint", lambda v, c: _path(v), "a non-empty path or builtin:NAME"),
    Rule("backbone.diffusion_steps", _optional_integer(1), "null (the model's default) or an integer >= 1"),
    # rollout: the keys the trainer ties to others (the rest: margrpo.rollout.config.RULES)
    Rule(
        "rollout.cfg_scale",
        lambda v, c: v > 0,
        "> 0 in a trainer config (0 samples unconditionally: the rollout and its likelihood ignore the prompt, so "
        "the update cannot teach the model to follow it)",
    ),
    Rule(
        "rollout.num_diffusion_steps",
        lambda v, c: v is None or v == c.backbone.diffusion_steps,
        "null or backbone.diffusion_steps (the trainer samples with backbone.diffusion_steps: set that)",
    ),
    Rule(
        "rollout.record_mask_steps",
        lambda v, c: v <= c.rollout.num_mask_steps,
        "at most rollout.num_mask_steps (only steps of the schedule can be recorded)",
    ),
    Rule(
        "rollout.record_diffusion_steps",
        lambda v, c: c.backbone.diffusion_steps is None or v <= c.backbone.diffusion_steps,
        "at most backbone.diffusion_steps when that is set (only steps of the chain can be recorded)",
    ),
    # grpo
    Rule("grpo.group_size", _at_least(2), "an integer >= 2 (advantages compare samples)"),
    Rule(
        "grpo.group_size",
        lambda v, c: c.grpo.group_noise != "antithetic" or v % 2 == 0,
        "an even integer with grpo.group_noise: antithetic (samples pair up)",
    ),
    Rule("grpo.prompts_per_step", _at_least(1), "an integer >= 1"),
    Rule(
        "grpo.advantage_eps",
        lambda v, c: finite(v) and 0 < v <= MAX_ADVANTAGE_EPS,
        f"a number in (0, {MAX_ADVANTAGE_EPS:g}] (added to the std; a larger one shrinks every advantage towards 0: "
        "grpo.advantage no_std drops the std instead)",
    ),
    Rule("grpo.clip_eps", lambda v, c: finite(v) and v > 0, "a finite number > 0"),
    Rule("grpo.clip_eps_high", lambda v, c: v is None or (finite(v) and v > 0), "null (= clip_eps) or a finite number > 0"),
    Rule("grpo.inner_epochs", _at_least(1), "an integer >= 1"),
    Rule("grpo.minibatches", _at_least(1), "an integer >= 1"),
    Rule("grpo.micro_batches", _at_least(1), "an integer >= 1"),
    Rule("grpo.kl_beta", lambda v, c: finite(v) and v >= 0, "a finite number >= 0 (0: no KL term, no ref policy)"),
    Rule("grpo.head_lr_scale", lambda v, c: finite(v) and v >= 0, "a finite number >= 0 (with head: low_lr)"),
    Rule(
        "grpo.mte",
        lambda v, c: not v or c.rollout.num_seeds >= 2,
        "false, or true with rollout.num_seeds >= 2 (the uncertainty is the std over seed trajectories)",
    ),
    Rule("grpo.mte_ratio", lambda v, c: 0 < v <= 1, "a ratio in (0, 1]"),
    Rule("grpo.mte_random_positions", _at_least(0), "an integer >= 0"),
    Rule("grpo.pixels_per_token", _at_least(1), "an integer >= 1"),
    Rule(
        "grpo.consistency",
        lambda v, c: not v or c.rollout.likelihood_positions == "unknown",
        "false, or true with rollout.likelihood_positions: unknown (with 'revealed' every transition is a "
        "committed token, which consistency always keeps)",
    ),
    Rule("grpo.consistency_threshold", lambda v, c: finite(v), "a finite number"),
    Rule("grpo.consistency_start_step", _at_least(0), "an integer >= 0"),
    Rule("grpo.matching_draws", _at_least(1), "an integer >= 1"),
    Rule(
        "grpo.matching_times",
        lambda v, c: isinstance(v, (list, tuple)) and len(v) == 2 and all(finite(x) for x in v) and 0 <= v[0] < v[1] <= 1,
        "[start, stop] with 0 <= start < stop <= 1 (fractions of the head's training times, 0 = clean)",
    ),
    Rule(
        "grpo.estimator",
        lambda v, c: v == "transition" or c.rollout.known_mask == "pre_step",
        "transition, or matching with rollout.known_mask: pre_step (matching scores each token under the canvas it was sampled from)",
    ),
    Rule(
        "grpo.estimator",
        lambda v, c: (
            v == "transition" or (c.grpo.kl_type == "gaussian" and c.grpo.normalization == "batch" and c.grpo.pixels_per_token == 1)
        ),
        "transition, or matching with grpo.kl_type: gaussian, grpo.normalization: batch, "
        "and grpo.pixels_per_token: 1 (the matching estimator has its own KL and scores whole tokens)",
    ),
    Rule("grpo.lora.rank", _at_least(0), "an integer >= 0 (0: LoRA off)"),
    Rule(
        "grpo.lora.rank",
        lambda v, c: not v or c.grpo.head == "frozen",
        "0 unless grpo.head: frozen (LoRA trains the adapters only; the ref policy is the base weights)",
    ),
    Rule("grpo.ref_refresh_every", _at_least(0), "an integer >= 0 (0: never)"),
    Rule(
        "grpo.ref_refresh_every",
        lambda v, c: not v or (c.grpo.kl_beta > 0 and not c.grpo.lora.rank),
        "0 unless grpo.kl_beta > 0 and grpo.lora.rank: 0 (with LoRA the ref policy is the base weights, "
        "which a refresh cannot set without merging the adapters)",
    ),
    Rule("grpo.lora.alpha", lambda v, c: v is None or (finite(v) and v > 0), "null (2 * rank) or a finite number > 0"),
    Rule("grpo.lora.dropout", lambda v, c: 0 <= v < 1, "a probability in [0, 1)"),
    Rule("grpo.lora.targets", lambda v, c: _regexes(v), "a list of Python regular expressions"),
    # optim
    Rule("optim.lr", lambda v, c: finite(v) and v >= 0, "a finite number >= 0 (0: the weights do not move)"),
    Rule("optim.weight_decay", lambda v, c: finite(v) and v >= 0, "a finite number >= 0"),
    Rule(
        "optim.weight_decay",
        lambda v, c: c.optim.lr * v < 1,
        "optim.lr * optim.weight_decay < 1 (AdamW multiplies the weights by 1 - lr * weight_decay every step: "
        "at 1 it zeroes them, above it flips their sign)",
    ),
    Rule(
        "optim.weight_decay",
        lambda v, c: c.grpo.head != "low_lr" or c.optim.lr * c.grpo.head_lr_scale * v < 1,
        "optim.lr * grpo.head_lr_scale * optim.weight_decay < 1 with grpo.head: low_lr (the head's decay)",
    ),
    Rule("optim.betas", lambda v, c: all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    Rule("optim.warmup_steps", _at_least(0), "an integer >= 0 (0: no warmup)"),
    Rule("optim.grad_clip", lambda v, c: v is None or v > 0, "null (no clipping) or a number > 0 (.inf: no clipping)"),
    # rewards (the names and options are checked when the rewards are built, before any work)
    Rule(
        "rewards",
        lambda v, c: bool(v) and all(_reward_entry(e) for e in v.values()),
        "a non-empty mapping: reward name -> finite weight (< 0: a penalty), or -> a mapping of options with an optional finite weight",
    ),
    Rule(
        "rewards",
        lambda v, c: any(reward_weight(e) != 0 for e in v.values()),
        "at least one non-zero weight (with every weight 0 the total reward is 0 for every sample: no signal)",
    ),
    # run
    Rule("run.steps", _at_least(0), "an integer >= 0"),
    Rule(
        "run.out_dir",
        lambda v, c: _path(v),
        "a non-empty path (empty would write into, and resume from, the working directory; '.' says so explicitly)",
    ),
    Rule("run.train_prompts", lambda v, c: v is None or _path(v), "null or a non-empty path"),
    Rule("run.eval_prompts", lambda v, c: v is None or _path(v), "null or a non-empty path"),
    Rule("run.seed", lambda v, c: _integer(v, 0, MAX_SEED - 1), "an integer in [0, 2^32)"),
    Rule("run.device", lambda v, c: _device(v), "auto (cuda when available, else cpu) or a torch device (cpu, cuda:1)"),
    Rule("run.eval_every", _at_least(0), "an integer >= 0 (0: evaluate only before and after)"),
    Rule("run.eval_per_category", _at_least(1), "an integer >= 1"),
    Rule("run.eval_samples_per_prompt", _at_least(1), "an integer >= 1"),
    Rule("run.eval_seed", lambda v, c: _integer(v, 0, MAX_SEED - 1), "an integer in [0, 2^32)"),
    Rule("run.save_every", _at_least(0), "an integer >= 0 (0: save only at the end and on a signal)"),
    Rule("run.keep_last", _at_least(0), "an integer >= 0 (0: keep every checkpoint)"),
    Rule("run.max_bad_steps", _at_least(1), "an integer >= 1"),
    Rule("run.flat_reward_warn_steps", _at_least(0), "an integer >= 0 (0: never warn)"),
    Rule("run.log_every", _at_least(1), "an integer >= 1"),
    Rule("run.ema_decay", lambda v, c: finite(v) and 0 <= v < 1, "a number in [0, 1) (0: no EMA)"),
    Rule("run.eval_ema", lambda v, c: not v or c.run.ema_decay > 0, "false, or true with run.ema_decay > 0"),
    Rule(
        "run.threads", lambda v, c: v is None or _integer(v, 1, MAX_THREADS), f"null (torch's default) or an integer in [1, {MAX_THREADS}]"
    ),
)
