"""One GRPO training step, in order (README, "One GRPO step, walked through"):

    prompts -> rollout -> rewards -> advantages -> update (margrpo.grpo.update: selection, loss,
    backward, gradient clip, optimizer step) -> learning rate, EMA, ref policy refresh -> metrics

The functions take the Trainer (margrpo.train.trainer), which holds the run's state (config, policy,
sampler, reward, optimizer, counters) and its lifecycle (setup, checkpoints, evaluation, the loop).
Their first argument being the trainer, they serve as its methods too (Trainer.train_step, rollout).
"""

from __future__ import annotations

import copy
import math
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from margrpo.grpo import advantages as adv_mod
from margrpo.grpo import update
from margrpo.grpo.selection import mte_tokens
from margrpo.rollout import choose_plan, generate, mask_schedule, mirror_pairs, sample_seed, shared_seed

from . import lora as lora_utils

if TYPE_CHECKING:
    from .config import TrainerConfig
    from .trainer import Trainer


class TrainingStopped(RuntimeError):
    """Raised when too many consecutive steps were skipped for non-finite values."""


def train_step(trainer: Trainer) -> dict[str, float]:
    """One step at trainer.step (rollout, rewards, update); every grpo.ref_refresh_every steps,
    skipped ones included, the ref policy then becomes the policy."""
    metrics = _rollout_and_update(trainer)
    every = trainer.config.grpo.ref_refresh_every
    if every and (trainer.step + 1) % every == 0:
        _refresh_ref_policy(trainer)
    return metrics


def _rollout_and_update(t: Trainer) -> dict[str, float]:
    g, step = t.config.grpo, t.step
    timings = {}
    t0 = time.perf_counter()
    prompts, rollout = step_rollout(t, step)
    timings["time/rollout"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    result = t.reward(rollout.images, prompts, step_metadata(t, step))
    rewards = result.total.float().to(t.device)
    timings["time/reward"] = time.perf_counter() - t0
    watch_flat_rewards(t, result.raw)
    all_rewards = t.collectives.all_gather_cat(rewards)  # the batch statistics cover every rank
    metrics = {k: v for k, v in result.log_values("reward").items() if not k.startswith("reward/total")}
    metrics.update({"reward_mean": all_rewards.mean().item(), "reward_std": all_rewards.std(unbiased=False).item()})
    if not t.collectives.all_ranks(torch.isfinite(rewards).all()):
        return _skip(t, "reward", metrics, timings)

    t0 = time.perf_counter()
    advantages = group_advantages(t, rewards, prompts)
    # grpo.drop_zero_variance: groups of identical rewards leave the policy term and its normaliser
    flat = adv_mod.zero_variance_groups(rewards, g.group_size)
    samples = ~flat if g.drop_zero_variance else None
    grad_clip = math.inf if t.config.optim.grad_clip is None else t.config.optim.grad_clip
    # an update of several optimizer steps can meet a non-finite loss after some of them: keep what
    # it starts from, so that a skipped step changes nothing (one step checks before it moves)
    snapshot = _Snapshot(t.policy, t.optimizer) if g.inner_epochs * g.minibatches > 1 else None
    # with LoRA the ref policy is the policy with its adapters disabled (a context), else the frozen copy
    ref_policy = lora_utils.adapters_disabled(t.policy) if g.kl_beta > 0 and g.lora.rank else t.ref_policy
    outcome = update(
        t.policy,
        ref_policy,
        rollout,
        advantages,
        g,
        t.optimizer,
        grad_clip=grad_clip,
        bf16=t.config.optim.bf16,
        collectives=t.collectives,
        samples=samples,
    )
    if outcome.skipped:
        if snapshot is not None:
            snapshot.restore()
        return _skip(t, outcome.skipped, metrics, timings)
    t.scheduler.step()
    if t.ema is not None:
        t.ema.update()
    timings["time/train"] = time.perf_counter() - t0
    t.bad_steps = 0
    metrics.update(outcome.metrics)
    all_advantages = t.collectives.all_gather_cat(advantages)
    metrics.update(
        {
            "advantage_mean": all_advantages.mean().item(),
            "advantage_abs_mean": all_advantages.abs().mean().item(),
            # groups whose rewards are all equal carry no advantage: a coarse reward starves GRPO
            "zero_variance_fraction": adv_mod.zero_variance_groups(all_rewards, g.group_size).float().mean().item(),
            "lr": t.scheduler.get_last_lr()[0],
            "skipped_total": t.skipped_total,
        }
    )
    total_time = sum(timings.values())
    metrics.update(timings)
    metrics["images_per_s"] = len(prompts) * t.world / max(total_time, 1e-9)
    return metrics


# ---------------------------------------------------------------------- prompts and rollout
def step_prompts(t: Trainer, step: int) -> tuple[list[str], list[int], list[int]]:
    """This rank's prompts (each repeated G times), their seeds, and global prompt slots.

    Prompt draws and seeds depend only on (run seed, step, global slot), never on the rank, so a
    run over W ranks samples exactly what one process would, and no two samples share noise."""
    picks, slots = _prompt_picks(t, step)
    g = t.config.grpo
    prompts = [t.train_prompts[picks[s]] for s in slots for _ in range(g.group_size)]
    seeds = [sample_seed(t.config.run.seed, step, s, i) for s in slots for i in range(g.group_size)]
    return prompts, seeds, slots


def step_metadata(t: Trainer, step: int) -> list[dict] | None:
    """The reward metadata of this rank's samples at `step` (as step_prompts orders them), or None
    when the train prompts carry none."""
    if t.train_metadata is None:
        return None
    picks, slots = _prompt_picks(t, step)
    return [t.train_metadata[picks[s]] for s in slots for _ in range(t.config.grpo.group_size)]


def _prompt_picks(t: Trainer, step: int) -> tuple[list[int], list[int]]:
    """(train prompt index of every global slot, this rank's global slots) at `step`."""
    g = t.config.grpo
    total = g.prompts_per_step * t.world
    rng = torch.Generator().manual_seed(t.config.run.seed * 1_000_003 + step)
    if len(t.prompt_groups) == 1:
        picks = torch.randint(len(t.train_prompts), (total,), generator=rng).tolist()
    else:  # a uniform group (category), then a uniform prompt of it
        kinds = torch.randint(len(t.prompt_groups), (total,), generator=rng).tolist()
        within = torch.rand(total, generator=rng, dtype=torch.float64).tolist()
        picks = [t.prompt_groups[k][int(u * len(t.prompt_groups[k]))] for k, u in zip(kinds, within)]
    slots = list(range(t.rank * g.prompts_per_step, (t.rank + 1) * g.prompts_per_step))
    return picks, slots


def step_rollout(t: Trainer, step: int):
    """(prompts, Rollout) of training step `step`: its prompts, seeds and recording plan, with the
    group's common random numbers under grpo.group_noise: common. The policy is put in eval mode."""
    prompts, seeds, slots = step_prompts(t, step)
    shared = mirror = None
    g = t.config.grpo
    if g.group_noise in ("common", "antithetic"):  # one seed per group
        shared = [shared_seed(t.config.run.seed, step, s) for s in slots for _ in range(g.group_size)]
    if g.group_noise == "antithetic":
        mirror = mirror_pairs(len(slots), g.group_size)
    t.policy.eval()
    return prompts, generate(
        t.policy,
        prompts,
        t.config.rollout,
        seeds,
        sampler=t.sampler,
        plan=record_plan(t, step),
        shared_seeds=shared,
        mirror=mirror,
        consistency_predictions=g.consistency,
        seed_selection=deferred_seed_selection(t.config),
    )


def deferred_seed_selection(config: TrainerConfig) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """generate's seed_selection for a training rollout: under MTE the seed chains past a recorded
    step's committed tokens run for the MTE tokens alone. None where they cannot be deferred (MTE off or
    with random positions, another estimator, or rollout settings that draw no such chains)."""
    if config.grpo.estimator != "transition" or config.rollout.seed_selection_conflicts():
        return None
    return mte_tokens(config.grpo)


def record_plan(t: Trainer, step: int):
    """The steps the rollout of `step` records, the same on every rank."""
    rollout_config = t.config.rollout
    counts = mask_schedule(t.policy.num_tokens, rollout_config.num_mask_steps, rollout_config.schedule)
    rng = torch.Generator().manual_seed(t.config.run.seed * 7_919 + step)
    plan = choose_plan(
        counts,
        t.sampler,
        rollout_config.record_mask_steps,
        rollout_config.record_diffusion_steps,
        rng,
        known_mask=rollout_config.known_mask,
        diffusion_range=rollout_config.record_diffusion_range,
    )
    # matching scores the committed tokens of the recorded mask steps: no transitions to record (the
    # same mask steps as under transition, so runs of the two estimators pair step by step)
    return plan.mask_steps_only() if t.config.grpo.estimator == "matching" else plan


# ---------------------------------------------------------------------- rewards and advantages
def group_advantages(t: Trainer, rewards: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """This rank's advantages [B], computed over the global batch (grpo.advantage)."""
    g = t.config.grpo
    all_rewards = t.collectives.all_gather_cat(rewards)
    if g.advantage == "tracker":
        all_prompts = t.collectives.all_gather_objects(prompts)
        advantages = t.tracker(all_prompts, all_rewards)
    else:
        advantages = adv_mod.group_advantages(
            all_rewards, g.group_size, g.advantage, g.advantage_eps, unbiased=g.advantage_std == "unbiased"
        )
    if g.drop_zero_variance:
        advantages = advantages * ~adv_mod.zero_variance_groups(all_rewards, g.group_size)
    mine = slice(t.rank * rewards.numel(), (t.rank + 1) * rewards.numel())
    return advantages[mine]


def watch_flat_rewards(t: Trainer, raw: dict[str, torch.Tensor]) -> None:
    """Count, per reward term, the steps in a row whose every group scored all its samples alike (no
    advantage for GRPO); say so on stderr when a count reaches run.flat_reward_warn_steps."""
    every = t.config.run.flat_reward_warn_steps
    for name, scores in raw.items():
        all_scores = t.collectives.all_gather_cat(scores.float().to(t.device))
        flat = adv_mod.zero_variance_groups(all_scores, t.config.grpo.group_size).all().item()
        t.flat_steps[name] = t.flat_steps.get(name, 0) + 1 if flat else 0
        if every and t.flat_steps[name] == every and t.is_main:
            print(
                f"[margrpo] step {t.step}: reward {name!r} gave every group identical scores for {every} "
                "steps in a row: it gives GRPO no advantage (a reward blind to these images or prompts, "
                "missing metadata, or a saturated score?)",
                file=sys.stderr,
            )


# ---------------------------------------------------------------------- skipped steps, refresh
class _Snapshot:
    """The trainable weights and the optimizer state at one moment, to restore after a skipped update.
    Costs a copy of both (about 3x the trainable parameters with AdamW) while the update runs."""

    def __init__(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.weights = [(p, p.detach().clone()) for p in policy.parameters() if p.requires_grad]
        self.state = copy.deepcopy(optimizer.state_dict())

    def restore(self) -> None:
        with torch.no_grad():
            for param, value in self.weights:
                param.copy_(value)
        self.optimizer.load_state_dict(self.state)


def _skip(t: Trainer, what: str, metrics: dict, timings: dict) -> dict:
    """A non-finite reward, loss or gradient: skip the update, count it, stop after too many."""
    t.bad_steps += 1
    t.skipped_total += 1
    with warnings.catch_warnings():  # the schedule follows the step count, skipped steps included
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        t.scheduler.step()
    metrics.update(timings)
    metrics.update({"skipped": what, "skipped_total": t.skipped_total})
    print(f"[margrpo] step {t.step}: non-finite {what}; update skipped ({t.bad_steps} in a row)", file=sys.stderr)
    if t.bad_steps >= t.config.run.max_bad_steps:
        raise TrainingStopped(
            f"{t.bad_steps} consecutive steps had a non-finite {what} (run.max_bad_steps="
            f"{t.config.run.max_bad_steps}); stopping. Last metrics: {metrics}"
        )
    return metrics


def _refresh_ref_policy(t: Trainer) -> None:
    """Copy the trainable weights into the ref policy (the frozen ones are equal already); under
    FSDP2 each rank gathers the full tensors, the ref policy being whole on every rank."""
    own = dict(t.ref_policy.named_parameters())
    with torch.no_grad():
        for name, param in t.policy.named_parameters():
            if param.requires_grad:
                own[name].copy_(param.full_tensor() if hasattr(param, "full_tensor") else param)
