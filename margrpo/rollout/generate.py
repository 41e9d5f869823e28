"""generate(): the MAR generation loop, recording exactly what GRPO training needs.

One loop over the effective mask steps of the schedule. At each step the backbone maps the prompt and
the canvas of known tokens to z for every position; the diffusion head samples the step's tokens with
K extra seed trajectories in one batched pass (margrpo.heads.multi_seed_denoise), recording the
transitions of the planned diffusion steps only at the planned mask steps.

Randomness is per sample (margrpo.rollout.seeding): image b draws its order, then a noise bank
[N, T_diff + 1, K + 1, C] (per position: the initial x_T and one standard normal per diffusion step,
for every trajectory and channel) from its own generator before the loop. A token's chains read
the bank at the token's position, so a sample never depends on what else shares the batch, and a
position re-denoised at a later mask step ("unknown" mode) sees the same noise (common random
numbers for the consistency test). The bank is transient: B N (T_diff + 1) (K + 1) C floats
(NOVA-like B=16, N=1024, T=25, K=3, C=16: 109 MB).

Common random numbers (`shared_seeds`): the samples of a GRPO group can share their order and every
noise draw except those of the recorded transitions (and of the seed trajectories), which stay their
own. Their rewards then differ only through what the likelihood scores, so the group baseline removes
the reward variance of everything else (which carries no gradient signal) while the policy gradient
stays unbiased: the shared draws are independent of every recorded action.

Mirrored pairs (`mirror`, with common random numbers): a sample can take the negated recorded noise
of a partner in its group instead of its own, so the pair's recorded transitions are x = mean +/- std
noise (antithetic variates). Their reward difference then holds only the odd part of the reward's
response to the recorded noise, which is what the score (linear in the noise) correlates with. Each
sample's own noise is still standard normal; a baseline that contains the partner's reward scales the
expected gradient by a positive factor (E[R(-e) s(e)] = -E[R(e) s(e)] for a Gaussian score s), so the
update's direction stays unbiased.

With the post-step known mask (margrpo.rollout.post_step) a recorded step keeps the transitions of
the positions still unknown after it and has them scored at the next effective step, whose forward
sees the post-step canvas: no extra backbone pass, and the image is the same as with "pre_step".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch

from margrpo.heads import multi_seed_denoise
from margrpo.models.base import check_backbone

from .commit_chains import CommitChains
from .config import RolloutConfig
from .guidance import condition_at, forward_rows, guidance_for, head_condition, prompt_rows
from .plan import RecordPlan, choose_plan, stochastic_steps
from .likelihood import true_indices
from .post_step import score_transitions
from .record import RECORDED, Rollout
from .schedule import effective_steps, mask_schedule
from .seeding import make_generators, plan_seed


def _check_inputs(prompts, seeds, config) -> None:
    if not isinstance(config, RolloutConfig):
        raise TypeError(f"config: got {type(config).__name__}, expected RolloutConfig")
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts: got {prompts!r}, expected a non-empty list of strings")
    bad = [p for p in prompts if not isinstance(p, str)]
    if bad:
        raise ValueError(f"prompts: got non-string entries {bad[:3]!r}, expected strings")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) != len(prompts):
        got = len(seeds) if isinstance(seeds, Sequence) else type(seeds).__name__
        raise ValueError(f"seeds: got {got}, expected a sequence of {len(prompts)} seeds (one per prompt)")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise ValueError(f"seeds: got {bad[:3]!r}, expected non-negative integers")


def _check_plan(plan: RecordPlan, counts: list[int], sampler, config: RolloutConfig) -> None:
    if plan.num_mask_steps > 0:
        config.check_recordable()
    usable_mask, usable_diff = set(effective_steps(counts)), set(stochastic_steps(sampler))
    steps = list(plan.mask_steps)
    if steps != sorted(set(steps)) or not set(steps) <= usable_mask:
        raise ValueError(f"plan.mask_steps: got {steps}, expected sorted distinct steps from {sorted(usable_mask)}")
    if len(plan.diffusion_steps) != len(steps):
        raise ValueError(f"plan.diffusion_steps: got {len(plan.diffusion_steps)} entries, expected {len(steps)}")
    for entry in plan.diffusion_steps:
        if list(entry) != sorted(set(entry)) or not set(entry) <= usable_diff or len(entry) != plan.num_diffusion_steps:
            raise ValueError(
                f"plan.diffusion_steps: got {entry}, expected {plan.num_diffusion_steps} sorted distinct "
                f"stochastic steps from {sorted(usable_diff)}"
            )


def _check_mirror(mirror: Sequence[int], shared_seeds: Sequence[int] | None, B: int) -> None:
    if shared_seeds is None:
        raise ValueError("mirror: needs shared_seeds (a mirrored pair must share its order and other noise)")
    mirror = list(mirror)
    if len(mirror) != B:
        raise ValueError(f"mirror: got {len(mirror)} entries for {B} prompts, expected one per sample")
    for i, j in enumerate(mirror):
        if isinstance(j, bool) or not isinstance(j, int) or not -1 <= j < B or j == i:
            raise ValueError(f"mirror[{i}]: got {j!r}, expected -1 or the index of another sample in [0, {B})")
        if j >= 0 and (mirror[j] != -1 or shared_seeds[j] != shared_seeds[i]):
            raise ValueError(
                f"mirror[{i}]: got {j}, expected a sample that draws its own noise (mirror[{j}] = -1) and shares sample {i}'s shared seed"
            )


def _draw_randomness(seeds, N: int, diff_steps: int, trajectories: int, C: int, device, dtype):
    """Per image, from its own generator: the order [N], then the noise bank [N, T_diff + 1, K+1, C]
    (the head's noise layout: index 0 the initial x_T, index i + 1 the noise of diffusion step i)."""
    orders, banks = [], []
    for generator in make_generators(seeds, device):
        orders.append(torch.randperm(N, generator=generator, device=device))
        banks.append(torch.randn(N, diff_steps + 1, trajectories, C, generator=generator, device=device, dtype=dtype))
    return torch.stack(orders), torch.stack(banks)


def _recorded_noise(order, counts, plan: RecordPlan, unknown_mode: bool, diff_steps: int) -> torch.Tensor:
    """bool [B, N, T_diff + 1]: the noise-bank entries of trajectory 0 that a recorded transition draws
    (position p denoised at recorded mask step j, diffusion step i in plan.diffusion_steps[j] -> entry
    i + 1); in "unknown" mode a recorded step denoises every position still unknown. A plan without
    diffusion steps (RecordPlan.mask_steps_only: the matching estimator scores committed tokens) keeps
    every entry of the tokens committed at its mask steps: their whole chain is the scored action."""
    B, N = order.shape
    private = torch.zeros(B, N, diff_steps + 1, dtype=torch.bool, device=order.device)
    recorded = dict(zip(plan.mask_steps, plan.diffusion_steps))
    whole_chain = plan.num_mask_steps > 0 and plan.num_diffusion_steps == 0
    start = 0
    for step in effective_steps(counts):
        if step in recorded:
            all_unknown = unknown_mode and not whole_chain
            positions = order[:, start:] if all_unknown else order[:, start : start + counts[step]]
            entries = torch.zeros(diff_steps + 1, dtype=torch.bool, device=order.device)
            entries[[i + 1 for i in recorded[step]]] = True
            if whole_chain:
                entries[:] = True
            rows = torch.arange(B, device=order.device)[:, None]
            private[rows, positions] |= entries  # "unknown" mode records a position at several steps
        start += counts[step]
    return private


def _gather_rows(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """values [B, N, ...] at positions [B, P] -> [B, P, ...]."""
    index = positions.reshape(*positions.shape, *([1] * (values.dim() - 2)))
    return values.gather(1, index.expand(*positions.shape, *values.shape[2:]))


def _join_records(at_commit: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """A recorded step's values [K+1, B, R, n, ...] at its committed tokens and trajectory 0's
    [1, B, R, P - n, ...] elsewhere -> [K+1, B, R, P, ...], trajectory 0's standing in for the seeds
    not drawn yet."""
    return torch.cat([at_commit, rest.expand(at_commit.shape[0], *rest.shape[1:])], 3)


def _stack_steps(per_step: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """M tensors [B, N, C] -> [B, M, N, C]; `like` [B, N, C] gives the shape when M = 0."""
    return torch.stack(per_step, 1) if per_step else like.new_zeros(like.shape[0], 0, *like.shape[1:])


@torch.no_grad()
def generate(
    backbone,
    prompts: Sequence[str],
    config: RolloutConfig,
    seeds: Sequence[int],
    *,
    sampler=None,
    plan: RecordPlan | None = None,
    shared_seeds: Sequence[int] | None = None,
    mirror: Sequence[int] | None = None,
    consistency_predictions: bool = True,
    seed_selection: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Rollout:
    """Generate one image per prompt and record the planned transitions.

    backbone: a margrpo.models.base.MARBackbone; prompts: B prompt strings (repeat a prompt for a GRPO
    group); seeds: B per-sample seeds (margrpo.rollout.seeding.group_seeds); sampler: the head's
    diffusion sampler (margrpo.diffusion; default backbone.make_sampler(config.num_diffusion_steps)).
    plan: the steps to record; by default drawn from a hash of the seeds, so the same seeds reproduce
    the same plan. shared_seeds: B seeds (equal within a GRPO group, margrpo.rollout.shared_seed) for
    common random numbers: the order and the main trajectory's noise come from them, except the noise
    of the recorded transitions, which (like the seed trajectories' noise) comes from `seeds`. None:
    everything from `seeds`. mirror (with shared_seeds): B indices, -1 for a sample that draws its own
    recorded noise, else the sample (same shared seed, itself drawing its own) whose recorded noise it
    takes negated (margrpo.rollout.seeding.mirror_pairs). consistency_predictions (likelihood_positions
    "unknown"): record the head's clean predictions at each recorded step and at the step before it,
    which consistency-aware selection compares; False skips the extra denoise of every unknown
    position at the steps before recorded ones (the Rollout then has no pred_clean / pred_clean_prev).
    seed_selection (MTE in "unknown" mode, pre-step known mask, step-drawn seed chains): a function of
    the seed tokens [K, B, N, C] giving bool [B, N], the tokens whose seed trajectories a loss will
    read (the update's MTE top-k). At a recorded step the seed chains of the positions not committed
    there run after the loop, for those tokens only; the other seed entries hold trajectory 0's
    record as a stand-in, and `Rollout.seed_recorded` marks the drawn ones. None: every seed drawn.
    Runs without gradient.
    """
    check_backbone(backbone)
    _check_inputs(prompts, seeds, config)
    if shared_seeds is not None:
        _check_inputs(prompts, shared_seeds, config)
    if mirror is not None:
        _check_mirror(mirror, shared_seeds, len(prompts))
    conflicts = config.seed_selection_conflicts() if seed_selection is not None else []
    if conflicts:
        raise ValueError(
            f"seed_selection: needs seed chains that a recorded step draws past its committed tokens; got {', '.join(conflicts)}"
        )
    if sampler is None:
        sampler = backbone.make_sampler(config.num_diffusion_steps)
    counts = mask_schedule(backbone.num_tokens, config.num_mask_steps, config.schedule)
    if plan is None:
        plan_rng = torch.Generator().manual_seed(plan_seed(seeds))
        plan = choose_plan(
            counts,
            sampler,
            config.record_mask_steps,
            config.record_diffusion_steps,
            plan_rng,
            known_mask=config.known_mask,
            diffusion_range=config.record_diffusion_range,
        )
    _check_plan(plan, counts, sampler, config)
    generation = _Generation(
        backbone, prompts, config, seeds, sampler, plan, counts, shared_seeds, mirror, consistency_predictions, seed_selection
    )
    for step in effective_steps(counts):
        generation.mask_step(step)
    return generation.finish()


class _Generation:
    """One generate() call: its randomness and prompt rows (set up here), the canvas that its mask
    steps fill in (`mask_step`), what the recorded steps keep (`_record`), and the Rollout (`finish`)."""

    def __init__(
        self,
        backbone,
        prompts,
        config: RolloutConfig,
        seeds,
        sampler,
        plan: RecordPlan,
        counts,
        shared_seeds,
        mirror,
        predictions: bool,
        seed_selection=None,
    ):
        self.backbone, self.prompts, self.config, self.seeds = backbone, list(prompts), config, seeds
        self.sampler, self.plan, self.counts = sampler, plan, counts
        B, N, C = len(prompts), backbone.num_tokens, backbone.token_channels
        K, diff_steps = config.num_seeds, sampler.num_steps
        # float64 for a float64 backbone (exact tests), else float32 (the head's accumulation dtype;
        # a bf16 backbone still records fp32)
        first = next(backbone.parameters(), None)
        device = torch.device("cpu") if first is None else first.device
        dtype = torch.float64 if first is not None and first.dtype == torch.float64 else torch.float32
        self.device, self.dtype = device, dtype
        self.compiles_head = config.compiles_head(device)

        self.order, self.noise_bank = _draw_randomness(seeds, N, diff_steps, K + 1, C, device, dtype)
        self.unknown_mode = config.likelihood_positions == "unknown"
        self.keeps_predictions = self.unknown_mode and predictions
        if shared_seeds is not None:
            self.order, shared_bank = _draw_randomness(shared_seeds, N, diff_steps, 1, C, device, dtype)
            own = _recorded_noise(self.order, counts, plan, self.unknown_mode, diff_steps)[..., None]
            bank = self.noise_bank
            bank[:, :, :, 0] = torch.where(own, bank[:, :, :, 0], shared_bank[:, :, :, 0])
            if mirror is not None:
                partner = torch.as_tensor(list(mirror), dtype=torch.long, device=device)
                mirrored = (partner >= 0)[:, None, None, None] & own
                bank[:, :, :, 0] = torch.where(mirrored, -bank[partner.clamp(min=0), :, :, 0], bank[:, :, :, 0])
        self.cond = prompt_rows(backbone, self.prompts, config)
        steps = effective_steps(counts)
        self.recorded_index = {step: j for j, step in enumerate(plan.mask_steps)}
        self.post_step = config.known_mask == "post_step"
        # with the consistency predictions the step before a recorded one also denoises every unknown
        # position, for the consistency test's previous prediction
        following = {steps[k - 1] for k in range(1, len(steps)) if steps[k] in self.recorded_index}
        self.needs_prev = following if self.keeps_predictions else set()

        self.canvas = torch.zeros(B, N, C, device=device, dtype=dtype)
        self.known = torch.zeros(B, N, dtype=torch.bool, device=device)
        self.seed_tokens = torch.zeros(K, B, N, C, device=device, dtype=dtype)
        M = plan.num_mask_steps
        self.records: list[dict[str, torch.Tensor]] = [{} for _ in range(M)]
        self.cfg_scales = [0.0] * M
        self.predictions: list = [None] * M  # keeps_predictions: pred_clean and pred_clean_prev per recorded step
        self.previous_predictions: list = [None] * M
        self.last_prediction = None
        self.commit_chains = CommitChains() if config.seed_chains == "commit" and K > 0 and M else None
        self.pending = None  # post-step mode: (j, positions, x_t and x_prev) of a recorded step, to score here
        self.seed_selection = seed_selection
        self.deferred: list = []  # seed_selection: (j, positions not committed at j, their head condition, scale)
        self.start = 0  # tokens known before the current mask step

    def mask_step(self, step: int) -> None:
        """Reveal the tokens of mask step `step`: the backbone's z for the canvas, the head's K + 1
        trajectories for the step's positions (committed ones first), trajectory 0 into the canvas."""
        config, backbone, canvas, start = self.config, self.backbone, self.canvas, self.start
        B, N, C = canvas.shape
        K = config.num_seeds
        n, j = self.counts[step], self.recorded_index.get(step)
        all_unknown = self.unknown_mode and (j is not None or step in self.needs_prev)
        positions = self.order[:, start:] if all_unknown else self.order[:, start : start + n]  # committed ones first
        P = positions.shape[1]
        z = forward_rows(backbone, self.cond, canvas, self.known, start)
        if self.pending is not None:  # this forward saw the previous recorded step's post-step canvas
            self._score_pending(z)
        scale = config.cfg_scale_at(start + n, N)
        committed = positions[:, :n]
        if j is None and P > n and K > 0:
            # the step before a recorded one, for the consistency test's previous prediction: the seed
            # chains only where tokens are committed (their final latents are the seed tokens), the
            # main chain alone at the other unknown positions (only its prediction is read there)
            chains = self._denoise(z, committed, K, scale, None).x0.to(self.dtype).reshape(K + 1, B, n, C)
            rest = self._denoise(z, positions[:, n:], 0, scale, None).x0.to(self.dtype).reshape(B, P - n, C)
            main = torch.cat([chains[0], rest], 1)
        elif j is not None and P > n and self.seed_selection is not None and self.plan.num_diffusion_steps:
            # the seed chains of the positions not committed here run after the loop, for the tokens
            # the loss will read them at (`_deferred_seed_chains`)
            at_commit, rest = self._denoise(z, committed, K, scale, j), self._denoise(z, positions[:, n:], 0, scale, j)
            chains = at_commit.x0.to(self.dtype).reshape(K + 1, B, n, C)
            main = torch.cat([chains[0], rest.x0.to(self.dtype).reshape(B, P - n, C)], 1)
            out = SimpleNamespace(**{name: _join_records(getattr(at_commit, name), getattr(rest, name)) for name in RECORDED})
            self.deferred.append((j, positions[:, n:], head_condition(z, self.cond, positions[:, n:]), scale))
        else:
            out = self._denoise(z, positions, K, scale, j)
            chains = out.x0.to(self.dtype).reshape(K + 1, B, P, C)
            main = chains[0]
        if self.commit_chains is not None:
            self.commit_chains.remember_commit(z, committed)
            if j is not None:
                self.commit_chains.remember_step(j, positions, head_condition(z, self.cond, positions))
        canvas.scatter_(1, committed[..., None].expand(-1, -1, C), main[:, :n])
        self.known.scatter_(1, committed, True)
        self.seed_tokens.scatter_(2, committed[None, :, :, None].expand(K, -1, -1, C), chains[1:, :, :n])
        prediction = None
        if all_unknown and self.keeps_predictions:  # committed tokens where known, the head's sample (trajectory 0) elsewhere
            prediction = canvas.clone().scatter_(1, positions[..., None].expand(-1, -1, C), main)
        if j is not None:
            self._record(j, out, positions, n, scale, prediction)
        self.last_prediction = prediction
        self.start += n

    def _denoise(self, z: torch.Tensor, positions: torch.Tensor, num_seeds: int, scale: float, j: int | None):
        """The head's main chain and `num_seeds` seed chains at positions [B, P] under z, from the
        noise bank (the first num_seeds + 1 trajectories), recording recorded mask step j's planned
        diffusion steps (none when j is None)."""
        B, P = positions.shape
        C = self.canvas.shape[-1]
        bank = _gather_rows(self.noise_bank[:, :, :, : num_seeds + 1], positions)  # only the trajectories it runs
        return multi_seed_denoise(
            self.backbone.head,
            head_condition(z, self.cond, positions),
            self.sampler,
            num_seeds=num_seeds,
            cfg=guidance_for(self.config, scale),
            record_steps=self.plan.diffusion_steps[j] if j is not None else (),
            temperature=self.config.temperature,
            noise=bank.reshape(B * P, -1, num_seeds + 1, C).permute(1, 2, 0, 3),
            cuda_graph=self.config.cuda_graph,
            images=B,
            compiled=self.compiles_head,
        )

    def _record(self, j: int, out, positions: torch.Tensor, n: int, scale: float, prediction) -> None:
        """Keep recorded mask step j's transitions and predictions. The head recorded them as
        [T, B, R, P, ...]; the rollout keeps each step's (R, P) flattened into its part of L."""
        self.cfg_scales[j] = scale
        drawn = {name: getattr(out, name).to(self.dtype) for name in RECORDED}
        if self.post_step:  # only the positions still unknown after the step; scored at the next step
            drawn = {name: value[:, :, :, n:] for name, value in drawn.items()}
            # scoring replaces std; keep the one trajectory 0 was drawn with (likelihood_std recorded_main)
            drawn["sampled_std"] = drawn["std"][:1]
            self.pending = (j, positions[:, n:], drawn) if positions.shape[1] > n else None  # the final step keeps none
        self.records[j] = {name: value.flatten(2, 3) for name, value in drawn.items()}
        if self.keeps_predictions:
            self.predictions[j] = prediction
            self.previous_predictions[j] = torch.zeros_like(self.canvas) if self.last_prediction is None else self.last_prediction

    def _score_pending(self, z: torch.Tensor) -> None:
        """Post-step known mask: score the previous recorded step's kept transitions under this step's
        z, which saw that step's post-step canvas (margrpo.rollout.post_step)."""
        j, later, drawn = self.pending
        scored = score_transitions(
            self.backbone.head,
            head_condition(z, self.cond, later),
            self.sampler,
            self.plan.diffusion_steps[j],
            drawn["x_t"],
            drawn["x_prev"],
            guidance_for(self.config, self.cfg_scales[j]),
            self.config.temperature,
        )
        self.records[j].update({name: value.flatten(2, 3) for name, value in zip(("logp", "mean", "std"), scored)})
        self.pending = None

    def finish(self) -> Rollout:
        """The Rollout: the final canvas decoded, the recorded steps concatenated along L."""
        config, canvas, records = self.config, self.canvas, self.records
        B, _, C = canvas.shape
        K = config.num_seeds
        if self.commit_chains is not None:  # the ref policy's seed chains: drawn under each token's commit-time z
            self.commit_chains.resample(
                records,
                self.backbone,
                self.cond,
                self.sampler,
                self.noise_bank,
                self.plan,
                lambda j: guidance_for(config, self.cfg_scales[j]),
                config.temperature,
                K,
                self.compiles_head,
            )

        seed_recorded = self._deferred_seed_chains() if self.seed_selection is not None else None

        def cat(name: str, tail: tuple[int, ...], trajectories: int = K + 1) -> torch.Tensor:
            parts = [r[name] for r in records]
            return torch.cat(parts, 2) if parts else torch.zeros(trajectories, B, 0, *tail, device=self.device, dtype=self.dtype)

        return Rollout(
            prompts=self.prompts,
            seeds=torch.tensor(list(self.seeds), dtype=torch.long, device=self.device),
            order=self.order,
            tokens=canvas,
            seed_tokens=self.seed_tokens,
            images=self.backbone.decode(canvas).to(self.dtype),
            x_t=cat("x_t", (C,)),
            x_prev=cat("x_prev", (C,)),
            mean=cat("mean", (C,)),
            std=cat("std", (C,)),
            logp=cat("logp", ()),
            pred_clean=_stack_steps(self.predictions, canvas) if self.keeps_predictions else None,
            pred_clean_prev=_stack_steps(self.previous_predictions, canvas) if self.keeps_predictions else None,
            reveal_counts=tuple(self.counts),
            plan=self.plan,
            cfg_scales=tuple(self.cfg_scales),
            config=config,
            sampler=self.sampler,
            sampled_std=cat("sampled_std", (C,), trajectories=1) if self.post_step else None,
            seed_recorded=seed_recorded,
        )

    def _deferred_seed_chains(self) -> torch.Tensor:
        """Run the deferred seed chains (seed_selection) for the selected tokens, writing their
        records in place of the stand-ins -> seed_recorded bool [B, L]: True where the seed entries
        were drawn (every committed token's, and the selected ones')."""
        B, R = self.canvas.shape[0], self.plan.num_diffusion_steps
        selected = self.seed_selection(self.seed_tokens)
        if not isinstance(selected, torch.Tensor) or selected.dtype != torch.bool or selected.shape != self.known.shape:
            got = f"{selected.dtype} {tuple(selected.shape)}" if isinstance(selected, torch.Tensor) else type(selected).__name__
            raise ValueError(f"seed_selection: returned {got}, expected bool {tuple(self.known.shape)} (B, N)")
        wanted = [selected.gather(1, later) for _, later, _, _ in self.deferred]  # [B, Q] per deferred step
        chosen = true_indices([want.reshape(-1) for want in wanted])  # image-major rows b * Q + q
        drawn = {}
        for (j, later, condition, scale), want, rows in zip(self.deferred, wanted, chosen):
            n = self.records[j]["logp"].shape[2] // R - later.shape[1]  # the step's committed tokens come first
            drawn[j] = torch.cat([torch.ones(B, n, dtype=torch.bool, device=want.device), want], 1)
            if rows.numel():
                self._draw_seeds(j, later, condition, scale, rows, n)
        parts = []
        for j in range(self.plan.num_mask_steps):
            positions = self.records[j]["logp"].shape[2] // max(R, 1)
            parts.append(drawn.get(j, torch.ones(B, positions, dtype=torch.bool, device=self.device)).repeat(1, R))
        return torch.cat(parts, 1) if parts else torch.zeros(B, 0, dtype=torch.bool, device=self.device)

    def _draw_seeds(self, j: int, later: torch.Tensor, condition: torch.Tensor, scale: float, rows: torch.Tensor, n: int) -> None:
        """The K seed chains of recorded step j at the tokens `rows` of `later` [B, Q] (its positions
        past the n committed ones), under the step's head condition and from the noise bank, as the
        step would have drawn them; their records replace the stand-ins."""
        config, K, C = self.config, self.config.num_seeds, self.canvas.shape[-1]
        B, Q = later.shape
        R = self.plan.num_diffusion_steps
        bank = _gather_rows(self.noise_bank[:, :, :, 1:], later).reshape(B * Q, -1, K, C)[rows]
        out = multi_seed_denoise(
            self.backbone.head,
            condition_at(condition, rows, B * Q),
            self.sampler,
            num_seeds=K - 1,  # the K seed trajectories, the first in the main chain's place
            cfg=guidance_for(config, scale),
            record_steps=self.plan.diffusion_steps[j],
            temperature=config.temperature,
            noise=bank.permute(1, 2, 0, 3),
            cuda_graph=config.cuda_graph,
            compiled=self.compiles_head,
        )
        P = n + Q
        image, column = rows // Q, rows % Q + n  # a transition's column in the step's part of L: r * P + p
        columns = torch.arange(R, device=rows.device)[:, None] * P + column[None]
        for name in RECORDED:
            self.records[j][name][1:, image[None], columns] = getattr(out, name).to(self.dtype)
