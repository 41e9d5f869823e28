"""update(): one GRPO update of a policy on a recorded rollout (margrpo.grpo.update).

    from margrpo.grpo import GRPOConfig, update
    result = update(policy, ref_policy, rollout, advantages, GRPOConfig(...), optimizer)

In order: the token selection (consistency-aware selection, uncertainty top-k for the multi-trajectory
expectation), the token weights (normalised once over the batch), the old log-probs when the update
scores under another guidance or other numerics than the rollout (`rescores_old`), the frozen
ref policy's likelihood for the KL, then per epoch and optimizer minibatch: the loss of every
micro-batch (images x recorded mask steps) recomputed with gradient under the policy, backward,
gradient averaging over ranks, clipping and one optimizer step.

The trainer (margrpo.train), `margrpo bench step` and the GPU benchmarks all run this function. It
reads no model code beyond the MARBackbone interface that margrpo.rollout.rollout_logprob uses, and
talks to other ranks only through `Collectives` (one process by default).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from margrpo.rollout import Rollout, RolloutChunk, rollout_logprob
from margrpo.rollout.likelihood import RolloutLikelihood

from .config import GRPOConfig
from .frozen_head import head_frozen
from .matching import matching_chunk_loss, matching_values, prepare_matching
from .objective import chunk_loss, grouped_token_weights, position_logp
from .selection import consistency_keep, mte_mask

STATS = ("loss", "policy", "kl", "clip_fraction", "approx_kl", "ratio_mean")


@dataclass
class Collectives:
    """How an update agrees with the other ranks of a data-parallel run. The defaults are those of
    one process; margrpo.train passes its torch.distributed versions."""

    all_ranks: Callable[[object], bool] = bool  # True when a flag holds on every rank
    reduce_gradients: Callable[[torch.nn.Module], None] = lambda module: None  # average .grad over ranks
    clip_grad_norm: Callable[[list, float], torch.Tensor] = torch.nn.utils.clip_grad_norm_  # -> the norm before
    mean: Callable[[float], float] = float  # the mean of a number over ranks
    all_gather_cat: Callable[[torch.Tensor], torch.Tensor] = lambda values: values  # every rank's, in rank order
    all_gather_objects: Callable[[list], list] = list  # every rank's items, in rank order


@dataclass
class UpdateResult:
    """metrics: the update's loss terms (summed over micro-batches, averaged over epochs and ranks),
    ratio_max, grad_norm (mean over optimizer steps), updates, selected_fraction, mte_fraction (nan
    without MTE). skipped: None, or "loss" / "gradient" when a non-finite value on some rank stopped
    the update before its optimizer step (gradients zeroed; earlier steps of the call stand)."""

    metrics: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None


def likelihood(model, rollout: Rollout, config: GRPOConfig, steps=None, bf16: bool = False, seed_positions=None) -> RolloutLikelihood:
    """The training likelihood of `rollout`'s recorded transitions under `model` (the guidance of
    config.likelihood_cfg), some recorded mask steps or all, autocast to bf16 when asked; the seed
    trajectories scored only at seed_positions [B, L] when given (rollout_logprob)."""
    device = rollout.tokens.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        return rollout_logprob(model, rollout, cfg=config.likelihood_cfg, steps=steps, seed_positions=seed_positions)


def token_selection(rollout: Rollout, config: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(keep bool [B, L, P]: the positions in the policy term, mte bool [B, L, P] or None: those whose
    term averages the trajectories), P = config.pixels_per_token positions per transition.
    Consistency-aware selection applies from the effective mask step config.consistency_start_step
    on; a step's committed tokens are always kept."""
    B, M, N, P = rollout.batch_size, rollout.plan.num_mask_steps, rollout.num_tokens, config.pixels_per_token
    keep = torch.ones(B, rollout.num_transitions, P, dtype=torch.bool, device=rollout.logp.device)
    if config.consistency:
        if rollout.pred_clean_prev is None:
            raise ValueError(
                "grpo.consistency: the rollout has no clean predictions to compare; generate it with "
                "likelihood_positions 'unknown' and consistency_predictions=True"
            )
        per_step = torch.ones(B, M, N, P, dtype=torch.bool, device=keep.device)
        for j in range(M):
            if rollout.effective_index(j) >= config.consistency_start_step:
                per_step[:, j] = consistency_keep(
                    rollout.pred_clean_prev[:, j],
                    rollout.pred_clean[:, j],
                    rollout.tokens,
                    rollout.committed(j),
                    config.consistency_threshold,
                    P,
                )
        keep = rollout.expand_to_l(per_step)
    mte = None
    if config.mte:
        mte = rollout.expand_to_l(
            mte_mask(rollout.seed_tokens, config.mte_ratio, P, k_rule=config.mte_k, random_positions=config.mte_random_positions)
        )
    return keep, mte


def update_weights(rollout: Rollout, keep: torch.Tensor, config: GRPOConfig, batches) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy weights [B, L, P], KL weights [B, L]) normalised over the batch or, with
    config.normalization "update", within each optimizer update's transitions (`batches`: minibatches)."""
    B, L, P = keep.shape
    dtype = rollout.logp.dtype
    groups = None
    if config.normalization == "update":
        groups = torch.full((B, L), -1, dtype=torch.long, device=keep.device)
        for u, minibatch in enumerate(batches):
            for images, steps in minibatch:
                rows = torch.tensor(images, dtype=torch.long, device=keep.device)
                cols = rollout.columns(steps)
                if isinstance(cols, slice):
                    groups[rows] = u
                else:
                    groups[rows[:, None], cols] = u
    pixel_groups = None if groups is None else groups[..., None].expand(B, L, P).reshape(B, L * P)
    weights = grouped_token_weights(keep.reshape(B, L * P), config.aggregation, dtype, pixel_groups).view(B, L, P)
    kl_weights = grouped_token_weights(torch.ones(B, L, dtype=torch.bool, device=keep.device), "token_mean", dtype, groups)
    return weights, kl_weights


def loss_std(chunk: RolloutChunk, config: GRPOConfig) -> torch.Tensor:
    """[T, b, l, C]: the std of the policy term's Gaussians when rebuilt from the means: the recorded
    std of every trajectory (the policy's for fixed variance), or trajectory 0's for all
    (likelihood_std: recorded_main, the Harmon reference). recorded_main takes the std the chain was
    sampled with: with the post-step known mask the recorded `std` is re-evaluated under the
    post-step canvas, and the reference holds the sampling-time one (`sampled_std`) constant."""
    std = chunk.std
    if config.likelihood_std != "recorded_main":
        return std
    main = std[:1] if chunk.sampled_std is None else chunk.sampled_std
    return main.expand_as(std)


def _take_positions(chunk: RolloutChunk, values: torch.Tensor) -> torch.Tensor:
    """Per-position values [B, L, P] of the whole rollout -> this chunk's [b, l * P]."""
    return chunk.take(values.movedim(-1, 0)).movedim(0, -1).flatten(1)


def minibatches(rollout: Rollout, config: GRPOConfig) -> list[list[tuple[list[int], list[int] | None]]]:
    """Optimizer minibatches, each a list of (image indices, recorded mask steps or None = all)
    micro-batches whose gradients accumulate into one optimizer step. min(config.minibatches, U)
    of them for U images (contiguous runs) or recorded mask steps (every minibatches-th step), their
    sizes differing by at most one."""
    B, M = rollout.batch_size, rollout.plan.num_mask_steps
    if config.minibatch_over == "mask_steps":
        parts = [sorted(list(range(M))[i :: config.minibatches]) for i in range(config.minibatches)]
        groups = [(list(range(B)), p) for p in parts if p]
    else:
        count = min(config.minibatches, B)  # ceil-sized runs would give fewer steps (B=9, m=4: 3)
        size, extra = divmod(B, count)
        bounds = [i * size + min(i, extra) for i in range(count + 1)]
        groups = [(list(range(bounds[i], bounds[i + 1])), None) for i in range(count)]
    out = []
    for images, steps in groups:
        if config.micro_batch_over == "mask_steps":
            steps = list(range(M)) if steps is None else steps
            parts = [sorted(steps[i :: config.micro_batches]) for i in range(config.micro_batches)]
            out.append([(images, p) for p in parts if p])
        else:
            size = math.ceil(len(images) / config.micro_batches)
            out.append([(images[i : i + size], steps) for i in range(0, len(images), size)])
    return out


def rescores_old(policy, rollout: Rollout, config: GRPOConfig, bf16: bool) -> bool:
    """Whether the ratio's old log-probs must be rescored by the training likelihood instead of taken
    from the rollout: when it scores without the rollout's guidance (likelihood_cfg none), or under
    other numerics (bf16 autocast, or half-precision weights, which the rollout's fused multi-seed
    path and the likelihood round differently), the first update would be off-policy by that
    difference alone (bf16 on the tiny model: ratio_max 2.5 at step 0)."""
    if config.objective != "clip":  # reinforce: no ratio
        return False
    unguided = config.likelihood_cfg == "none" and rollout.config.uses_cfg
    half = any(p.dtype in (torch.bfloat16, torch.float16) for p in policy.parameters())
    return unguided or bf16 or half


def old_values(policy, rollout: Rollout, config: GRPOConfig, batches, bf16: bool, mte: torch.Tensor | None = None) -> Rollout:
    """`rollout` with old log-probs and means scored by the training likelihood without gradient,
    chunk by chunk as the update's first epoch scores them, so that epoch's ratio is 1 to rounding
    (the seed trajectories at the MTE positions `mte` [B, L, P] only, as the loss scores them)."""
    old_logp, old_mean = rollout.logp.clone(), rollout.mean.clone()
    with torch.no_grad():
        for minibatch in batches:
            for images, steps in minibatch:
                chunk = rollout.chunk(images, steps)
                seed_positions = None if mte is None else chunk.take(mte.any(-1))
                lik = likelihood(policy, chunk.rollout, config, steps=chunk.steps, bf16=bf16, seed_positions=seed_positions)
                rows = torch.tensor(images, dtype=torch.long, device=old_logp.device)
                cols = rollout.columns(steps)
                at = (slice(None), rows) if isinstance(cols, slice) else (slice(None), rows[:, None], cols[None])
                old_logp[at], old_mean[at] = lik.logp.to(old_logp.dtype), lik.mean.to(old_mean.dtype)
    return rollout.with_update_values(old_logp=old_logp, old_mean=old_mean)


def _chunk_loss(policy, chunk: RolloutChunk, advantages, weights, mte, kl_weights, config: GRPOConfig, bf16: bool, old_is_current: bool):
    """The loss of one chunk, recomputed with gradient under the policy; old_is_current: the ratio
    divides by this forward's own values (see `_transition_losses`). Under MTE the seed trajectories
    are scored at the MTE positions only: the policy term reads them nowhere else."""
    seed_positions = None if mte is None else chunk.take(mte.any(-1))
    lik = likelihood(policy, chunk.rollout, config, steps=chunk.steps, bf16=bf16, seed_positions=seed_positions)
    # one std for every Gaussian of the loss (the reference code has no Gaussian KL to copy): the old
    # log-probs (the first update's ratio is then 1), the gaussian KL (the policy term's Gaussians)
    # and, under recorded_main, k3's ref log-probs (the ref policy's own std, e.g. the post-step
    # one, is not the constant: k3 would not be 0 where the policy is the ref policy)
    std, ref_logp = loss_std(chunk, config), chunk.ref_logp
    # per latent pixel, or with the recorded std: the policy term's log-probs are rebuilt from the
    # likelihood's means instead of taken from its per-token log-probs
    if config.pixels_per_token > 1 or config.likelihood_std == "recorded_main":
        x_prev, P = chunk.take(chunk.source.x_prev), config.pixels_per_token
        logp = position_logp(x_prev, lik.mean.to(x_prev.dtype), std, P)
        old = position_logp(x_prev, chunk.old_mean, std, P)
        if config.likelihood_std == "recorded_main" and config.kl_type == "k3_logp" and chunk.ref_mean is not None:
            ref_logp = position_logp(x_prev, chunk.ref_mean.to(x_prev.dtype), std)
    else:
        logp, old = lik.logp, chunk.old_logp
    if config.objective == "reinforce" or old_is_current:
        old = logp.detach()
    kl_beta = config.kl_beta if chunk.ref_logp is not None else 0.0
    rows = torch.tensor(chunk.images, dtype=torch.long, device=advantages.device)
    return chunk_loss(
        logp,
        old,
        advantages.index_select(0, rows),
        _take_positions(chunk, weights),
        mte_mask=None if mte is None else _take_positions(chunk, mte),
        clip_eps=config.clip_eps,
        clip_eps_high=config.clip_eps_high,
        kl_beta=kl_beta,
        kl_type=config.kl_type,
        kl_weights=chunk.take(kl_weights),
        mean=lik.mean,
        std=std,
        ref_mean=chunk.ref_mean,
        ref_logp=ref_logp,
        mte_include_rollout=config.mte_include_rollout,
        channel_reduction=config.channel_reduction,
        pixels_per_token=config.pixels_per_token,
    )


def _transition_losses(policy, ref_context, rollout: Rollout, advantages, config: GRPOConfig, batches, samples, bf16: bool):
    """(loss of a chunk, selected fraction, MTE mask or None) of the transition estimator: token
    selection and weights, rescored old log-probs when needed, the ref policy's likelihood for the KL."""
    keep, mte = token_selection(rollout, config)
    if mte is None:  # without MTE the loss reads trajectory 0 alone (objective.chunk_loss)
        rollout = rollout.main_trajectory()
    elif rollout.seed_recorded is not None and bool((mte.any(-1) & ~rollout.seed_recorded).any()):
        raise ValueError(
            "rollout: its seed trajectories were drawn for other tokens than this update's MTE positions "
            "(generate's seed_selection must choose the tokens grpo.mte does: margrpo.grpo.selection.mte_tokens)"
        )
    if samples is not None:
        keep = keep & samples.to(keep.device)[:, None, None]
    weights, kl_weights = update_weights(rollout, keep, config, batches)
    # old log-probs that must be rescored (`rescores_old`): when the update takes one optimizer step
    # (every chunk is scored before it), the policy that scores the loss is the old one, so the ratio
    # divides by the loss forward's own values, detached: no separate forward without gradient (a
    # tenth of a NOVA step), and a ratio of exactly 1 rather than 1 up to the two forwards' rounding
    old_is_current = False
    if rescores_old(policy, rollout, config, bf16):
        if config.inner_epochs == 1 and len(batches) == 1:
            old_is_current = True
        else:
            rollout = old_values(policy, rollout, config, batches, bf16, mte)
    policy.train()
    if ref_context is not None:
        with torch.no_grad(), ref_context as model:
            model.train(policy.training)  # the same forward mode as the policy's likelihood
            # the KL reads trajectory 0 (objective.chunk_loss): the seed trajectories are not scored
            ref = likelihood(model, rollout.main_trajectory(), config, bf16=bf16)
        rollout = rollout.with_update_values(ref_logp=ref.logp, ref_mean=ref.mean)

    def loss_of(images, steps):
        chunk = rollout.chunk(images, steps)
        return _chunk_loss(policy, chunk, advantages, weights, mte, kl_weights, config, bf16, old_is_current)

    return loss_of, keep.float().mean().item(), mte


def _matching_losses(policy, ref_context, rollout: Rollout, advantages, config: GRPOConfig, batches, samples, bf16: bool):
    """The same for the matching estimator (margrpo.grpo.matching): draws, weights, old scores when an
    optimizer step precedes a chunk's first evaluation, the ref policy's predictions for the KL."""
    device = rollout.tokens.device

    def scoring(model, part, draws, steps):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return matching_values(model, part, draws, cfg=config.likelihood_cfg, steps=steps)

    prepared = prepare_matching(policy, ref_context, rollout, config, batches, samples, scoring)

    def loss_of(images, steps):
        return matching_chunk_loss(policy, rollout, prepared, advantages, images, steps, config, scoring)

    return loss_of, prepared.weights.gt(0).float().mean().item(), prepared.uncertain


def update(
    policy,
    ref_policy,
    rollout: Rollout,
    advantages: torch.Tensor,
    config: GRPOConfig,
    optimizer,
    *,
    grad_clip: float = 1.0,
    bf16: bool = False,
    collectives: Collectives | None = None,
    samples: torch.Tensor | None = None,
) -> UpdateResult:
    """One GRPO update of `policy` (a MARBackbone whose trainable parameters `optimizer` steps) on
    `rollout` (margrpo.rollout.generate, by the policy in the mode it is in now) with advantages [B].

    ref_policy: the frozen ref policy of the KL term (a module), a context manager that yields it
    (e.g. the policy with its LoRA adapters disabled), or None when config.kl_beta is 0. Old
    log-probs that need recomputing (`rescores_old`) are scored in the policy's current mode (the
    rollout's); the policy then trains in training mode, and a ref policy module runs in the same mode.
    With config.head "frozen" the head takes no gradient during the call, whatever its flags.
    grad_clip: max gradient norm per optimizer step; bf16: autocast the likelihood forwards.
    samples: bool [B], the images whose transitions enter the policy term and its token-weight
    normaliser (None: all; grpo.drop_zero_variance leaves out groups of identical rewards).
    The gradients are zeroed before every optimizer step, so `optimizer` sees only this update's.
    """
    collectives = collectives or Collectives()
    B = rollout.batch_size
    if advantages.shape != (B,):
        raise ValueError(f"advantages: got shape {tuple(advantages.shape)}, expected ({B},), one per image of rollout")
    if not bool(torch.isfinite(advantages).all()):  # else a NaN loss, skipped without saying why
        bad = int((~torch.isfinite(advantages)).sum())
        raise ValueError(
            f"advantages: got {bad} non-finite values of {B}, expected finite numbers (a NaN reward, or advantages of a group of one?)"
        )
    if config.kl_beta > 0 and ref_policy is None:
        raise ValueError(f"ref_policy: got None with grpo.kl_beta={config.kl_beta}, expected the frozen ref policy (or set kl_beta to 0)")
    if (
        config.pixels_per_token > 1
        and config.likelihood_std == "policy"
        and getattr(rollout.sampler, "variance_type", None) == "learned_range"
    ):
        raise ValueError(
            f"pixels_per_token: {config.pixels_per_token} rebuilds the log-probs from the recorded std, which a "
            "learned-range variance (this rollout's sampler) does not fix; set likelihood_std: recorded_main "
            "or pixels_per_token: 1"
        )
    if samples is not None and samples.shape != (B,):
        raise ValueError(f"samples: got shape {tuple(samples.shape)}, expected ({B},), one flag per image of rollout")
    batches = minibatches(rollout, config)
    context = None
    if config.kl_beta > 0:
        context = contextlib.nullcontext(ref_policy) if isinstance(ref_policy, torch.nn.Module) else ref_policy
    sums = dict.fromkeys(STATS, 0.0)
    ratio_max, grad_norms = 1.0, []
    with head_frozen(policy, config):  # grpo.head: frozen holds whatever the caller set on the head
        if config.estimator == "matching":
            loss_of, selected, mte = _matching_losses(policy, context, rollout, advantages, config, batches, samples, bf16)
        else:
            loss_of, selected, mte = _transition_losses(policy, context, rollout, advantages, config, batches, samples, bf16)
        for _ in range(config.inner_epochs):
            for minibatch in batches:
                optimizer.zero_grad(set_to_none=True)
                for images, steps in minibatch:  # micro-batches accumulate into one optimizer step
                    out = loss_of(images, steps)
                    if not collectives.all_ranks(torch.isfinite(out.loss)):
                        optimizer.zero_grad(set_to_none=True)
                        return UpdateResult(skipped="loss")
                    out.loss.backward()
                    for key in STATS:
                        sums[key] += float(getattr(out, key).detach())
                    ratio_max = max(ratio_max, float(out.ratio_max))
                collectives.reduce_gradients(policy)
                params = [p for p in policy.parameters() if p.grad is not None]
                norm = collectives.clip_grad_norm(params, grad_clip) if params else torch.zeros(())
                if not torch.isfinite(norm):
                    optimizer.zero_grad(set_to_none=True)
                    return UpdateResult(skipped="gradient")
                optimizer.step()
                grad_norms.append(norm.item())
    metrics = {key: collectives.mean(value / config.inner_epochs) for key, value in sums.items()}
    metrics.update(
        {
            "ratio_max": ratio_max,
            "grad_norm": sum(grad_norms) / max(1, len(grad_norms)),
            "updates": len(grad_norms),
            "selected_fraction": selected,
            "mte_fraction": float("nan") if mte is None else mte.float().mean().item(),
        }
    )
    return UpdateResult(metrics)
