"""Why RL does or does not move a model: four checks on one GRPO step, as a library and a command.

    margrpo diagnose --config configs/shapes-tiny.yaml [--etas 0,1e-4,3e-4,1e-3] [key=value ...]

1. recorded log-probs: the rollout's stored log-prob of every recorded transition equals the Gaussian
   log-density of its own (x_prev, mean, std): the sampler wrote what it sampled.
2. on-policy ratio: the training likelihood (the update's forward mode and numerics) of the same
   transitions under the unchanged policy reproduces the stored log-probs, so the first update's
   ratio is 1 (its largest |log ratio| is reported; fp32 rounding gives ~1e-3 on late, small-std steps).
   Under grpo.estimator: matching, the matching scores of the update's draws in the rollout's forward
   mode against the training mode's (the old and the new score of the first update).
3. signal: the fraction of groups whose rewards are all equal (they carry no advantage at all).
4. direction: the policy-gradient direction of one step, applied with growing step sizes eta, and the
   mean reward of fresh samples of the same prompts (fixed seeds, so the comparison between step sizes
   is paired): if no eta raises the reward, the update direction itself carries no usable signal and no
   learning-rate tuning can help. Two directions: the gradient scaled to unit RMS per parameter, and
   its sign (what Adam's first step applies, whatever the gradient's magnitude).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import re
import sys
import warnings
from dataclasses import dataclass, field

import torch
import yaml

from margrpo.grpo import GRPOConfig
from margrpo.rollout import RolloutConfig
from margrpo.grpo.advantages import zero_variance_groups
from margrpo.ops import oracle


def recorded_logp_error(rollout) -> float:
    """Largest |stored logp - log N(x_prev; mean, std^2)| over the recorded transitions (0 if none)."""
    if rollout.logp.numel() == 0:
        return 0.0
    C = rollout.x_prev.shape[-1]
    recomputed = oracle.gaussian_logprob_fwd(
        rollout.x_prev.double().reshape(-1, C),
        rollout.mean.double().reshape(-1, C),
        rollout.std.double().reshape(-1, C),
        oracle.REDUCE_SUM,
    )
    return float((rollout.logp.double().reshape(-1) - recomputed).abs().max())


def first_update_log_ratio(trainer, rollout) -> float:
    """Largest |log ratio| of the first update: the trainer's training likelihood of the rollout's
    transitions under the policy that sampled them, against the stored log-probs. Under the matching
    estimator: the scores the update's ratio divides by (the rollout's forward mode) against those of
    its first evaluation (the training mode), on the update's own draws."""
    if trainer.config.grpo.estimator == "matching":
        return _matching_log_ratio(trainer, rollout)
    if rollout.logp.numel() == 0:
        return 0.0
    from margrpo.grpo.policy_update import likelihood

    was_training = trainer.policy.training
    trainer.policy.train()  # the update's forward mode
    with torch.no_grad():
        logp = likelihood(trainer.policy, rollout, trainer.config.grpo, bf16=trainer.config.optim.bf16).logp
    trainer.policy.train(was_training)
    return float((logp.double() - rollout.logp.double()).abs().max())


def _matching_log_ratio(trainer, rollout) -> float:
    from margrpo.grpo.matching import draw_matching, matching_score, matching_values

    config, policy = trainer.config.grpo, trainer.policy
    draws = draw_matching(rollout, config.matching_draws, tuple(config.matching_times))
    was_training = policy.training
    scores = []
    with torch.no_grad(), torch.autocast(rollout.tokens.device.type, dtype=torch.bfloat16, enabled=trainer.config.optim.bf16):
        for training in (was_training, True):
            policy.train(training)
            values = matching_values(policy, rollout, draws, cfg=config.likelihood_cfg)
            scores.append(matching_score(values, config.channel_reduction).double())
    policy.train(was_training)
    return float((scores[1] - scores[0]).abs().max()) if scores[0].numel() else 0.0


@dataclass
class SelfConsistency:
    """The frozen head's denoising error (the matching estimator's 1/2 sum_c (f - y)^2, per token and
    draw) on the rollout's own committed tokens against data tokens of the same prompts, by training
    time bin: a head far less accurate on the policy's tokens than on data scores them by its own
    mismatch, which the matching estimator then learns from."""

    bins: list[tuple[int, int]]
    policy_error: list[float]
    data_error: list[float]

    def table(self) -> str:
        lines = [
            "head self-consistency: denoising error on the policy's committed tokens vs data tokens",
            f"  {'t bin':>11} {'policy':>9} {'data':>9} {'ratio':>7}",
        ]
        for (low, high), p, d in zip(self.bins, self.policy_error, self.data_error):
            lines.append(f"  [{low:>4}, {high:>4}) {p:>9.4f} {d:>9.4f} {p / max(d, 1e-30):>7.2f}")
        return "\n".join(lines)


def head_self_consistency(
    trainer, rollout, data_tokens: torch.Tensor, draws: int = 16, edges: tuple[int, ...] = (0, 50, 150, 400, 700, 1000)
) -> SelfConsistency:
    """SelfConsistency of `rollout` (recorded mask steps, committed tokens) against `data_tokens`
    [B, N, C] (e.g. ground-truth latents of the same prompts), scored on the same draws and canvases
    built the same way (the data's own tokens as context). DDPM heads (integer training times)."""
    from margrpo.grpo.matching import draw_matching, matching_values

    if data_tokens.shape != rollout.tokens.shape:
        raise ValueError(f"data_tokens: got shape {tuple(data_tokens.shape)}, expected {tuple(rollout.tokens.shape)}")
    data = dataclasses.replace(rollout, tokens=data_tokens.to(rollout.tokens))
    drawn = draw_matching(rollout, draws)
    times = torch.cat(drawn.times, 2).double()
    errors = []
    with torch.no_grad():
        for source in (rollout, data):
            values = matching_values(trainer.policy, source, drawn, cfg=trainer.config.grpo.likelihood_cfg)
            errors.append(0.5 * (values.prediction.double() - values.target.double()).pow(2).sum(-1))
    bins = list(zip(edges[:-1], edges[1:]))
    policy, dataset = [], []
    for low, high in bins:
        inside = (times >= low) & (times < high)
        policy.append(float(errors[0][inside].mean()) if inside.any() else math.nan)
        dataset.append(float(errors[1][inside].mean()) if inside.any() else math.nan)
    return SelfConsistency(bins, policy, dataset)


def zero_variance_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of groups (consecutive `group_size` rewards) whose rewards are all equal."""
    flat = zero_variance_groups(rewards.flatten(), group_size)
    return float(flat.view(-1, group_size)[:, 0].float().mean())


class _GradientCapture:
    """Stands in for the optimizer for one train_step: keeps the (clipped) gradient, changes nothing."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.param_groups = optimizer.param_groups
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.grads: list[torch.Tensor] | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        # several minibatches: their gradients add up to the step's direction
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in self.params]
        self.grads = grads if self.grads is None else [a + b for a, b in zip(self.grads, grads)]


@dataclass
class StepScan:
    direction: str
    etas: list[float]
    reward: list[float]  # mean reward of the fresh samples at each eta
    gain: list[float]  # paired mean difference to eta = 0 ...
    gain_se: list[float]  # ... and its standard error


@dataclass
class Diagnosis:
    recorded_logp_error: float
    first_update_log_ratio: float
    zero_variance_fraction: float
    train_reward: float
    grad_norm: float
    scans: list[StepScan] = field(default_factory=list)

    def table(self) -> str:
        lines = [
            f"recorded logp vs Gaussian of (x_prev, mean, std): max |diff| {self.recorded_logp_error:.2e}",
            f"first update, training likelihood vs recorded:   max |log ratio| {self.first_update_log_ratio:.2e}",
            f"groups with zero reward variance:                {self.zero_variance_fraction:.3f}",
            f"train reward {self.train_reward:.3f}, gradient norm {self.grad_norm:.3g}",
        ]
        for scan in self.scans:
            lines.append(f"step along the {scan.direction} (fresh samples of the same prompts, paired):")
            lines.append(f"  {'eta':>9} {'reward':>8} {'gain':>8} {'+-se':>7}")
            for eta, r, g, se in zip(scan.etas, scan.reward, scan.gain, scan.gain_se):
                lines.append(f"  {eta:>9.2g} {r:>8.4f} {g:>+8.4f} {se:>7.4f}")
        return "\n".join(lines)


def _fresh_rewards(trainer, prompts: list[str], samples: int, seed: int, metadata: list[dict] | None = None) -> torch.Tensor:
    """Rewards of `samples` fresh images per prompt (seed `seed`), drawn in eval mode as a rollout is
    (an update leaves the policy in train mode, where a backbone may drop prompts)."""
    from .evaluate import generate_images

    training = trainer.policy.training
    trainer.policy.eval()
    try:
        expanded, images = generate_images(trainer.policy, trainer.sampler, trainer.config.rollout, prompts, samples, seed)
    finally:
        trainer.policy.train(training)
    expanded_meta = None if metadata is None else [m for m in metadata for _ in range(samples)]
    return trainer.reward(images, expanded, expanded_meta).total.double().cpu()


def _distinct_prompts(prompts: list[str], metadata: list[dict] | None) -> tuple[list[str], list[dict] | None]:
    """A step's prompts without the group repeats, in order, and their metadata (None if none)."""
    unique = list(dict.fromkeys(prompts))
    by_prompt = None if metadata is None else dict(zip(prompts, metadata))
    return unique, None if by_prompt is None else [by_prompt[p] for p in unique]


def _step_gradient(trainer, step: int) -> list[torch.Tensor]:
    """The (clipped) update direction of the trainer's step `step` (its prompts, seeds and plan);
    weights, optimizer and step counter unchanged."""
    optimizer, capture, current = trainer.optimizer, _GradientCapture(trainer.optimizer), trainer.step
    trainer.optimizer, trainer.step = capture, step
    try:
        with warnings.catch_warnings():  # the scheduler steps although the stand-in optimizer did not
            warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
            metrics = trainer.train_step()
    finally:
        trainer.optimizer, trainer.step = optimizer, current
    if capture.grads is None:
        raise RuntimeError(f"step {step} was skipped ({metrics.get('skipped')}); no gradient")
    return capture.grads


@dataclass
class GradientVariance:
    """Spread of the per-step policy-gradient estimate over independent rollouts (steps 0..n-1)."""

    variant: str
    rollouts: int
    mean_sq_norm: float  # ||mean gradient||^2
    total_variance: float  # trace of the covariance: mean ||g_i - mean||^2 (unbiased)
    relative_variance: float  # total_variance / mean_sq_norm: lower = a more reliable direction
    # unbiased estimate of ||E g||^2 (mean_sq_norm overstates it by total_variance / rollouts); near
    # or below 0: the expected gradient is not detectable in one step's estimate
    signal_sq_norm: float
    gram: torch.Tensor | None = field(repr=False, default=None)  # float64 [n, n]: g_i . g_j, for variance_ratio
    flat: torch.Tensor | None = field(repr=False, default=None)  # float64 [n, P]: the rollouts' gradients

    @property
    def signal_to_noise(self) -> float:
        """|E g|^2 / tr Cov: the per-rollout signal-to-noise of the update direction (unbiased numerator)."""
        return self.signal_sq_norm / max(self.total_variance, 1e-300)


def _total_variance(gram: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Unbiased trace of the covariance of the sample that takes rollout i counts[..., i] times
    (counts [..., n] summing to n), from the Gram matrix [n, n] of the rollouts' gradients."""
    n = counts.shape[-1]
    diagonal = (counts * gram.diagonal()).sum(-1)
    cross = torch.einsum("...i,ij,...j->...", counts, gram, counts)
    return (diagonal - cross / n) / (n - 1)


def variance_ratio(
    a: GradientVariance,
    b: GradientVariance,
    resamples: int = 4000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """tr Cov of variant a / tr Cov of variant b, and its 95% paired-bootstrap interval (the same
    resampled rollouts for both variants, which share their rollouts)."""
    if a.gram is None or b.gram is None or a.gram.shape != b.gram.shape:
        raise ValueError("variance_ratio: needs two results of one gradient_variance call (same rollouts)")
    n = a.gram.shape[0]
    centre = torch.eye(n, dtype=torch.float64) - 1 / n  # variances do not move with the origin; centred
    grams = [centre @ g.double() @ centre for g in (a.gram, b.gram)]  # Grams avoid cancellation
    counts = _bootstrap_counts(n, resamples, seed)
    ratios = _total_variance(grams[0], counts) / _total_variance(grams[1], counts)
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return a.total_variance / b.total_variance, low, high


def _snr_of(gram: torch.Tensor) -> float:
    """(|mean|^2 - tr Cov / n) / tr Cov of the n rollouts whose Gram matrix [n, n] is `gram`."""
    n = gram.shape[0]
    total = float(gram.diagonal().sum() - gram.sum() / n) / (n - 1)
    return (float(gram.sum()) / n**2 - total / n) / total


def _jackknife_interval(estimate: float, leave_one_out: list[float]) -> tuple[float, float]:
    """95% interval estimate +- t(n-1) * jackknife standard error. Leave-one-out subsets hold no
    repeated rollout, so estimators that assume independent rollouts (the unbiased |E g|^2) stay
    valid on them; a bootstrap resample's repeats bias those upwards."""
    from .ablate import T95

    n = len(leave_one_out)
    mean = sum(leave_one_out) / n
    se = math.sqrt((n - 1) / n * sum((v - mean) ** 2 for v in leave_one_out))
    t = T95[n - 2] if 2 <= n <= len(T95) + 1 else 1.96  # Student's t with n - 1 degrees of freedom
    return estimate - t * se, estimate + t * se


def _bootstrap_counts(n: int, resamples: int, seed: int) -> torch.Tensor:
    picks = torch.randint(n, (resamples, n), generator=torch.Generator().manual_seed(seed))
    counts = torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(1, picks, torch.ones(resamples, n, dtype=torch.float64))
    return counts[(counts > 0).sum(1) >= 2]  # a resample of one rollout repeated has no variance


def _without(matrix: torch.Tensor, i: int) -> torch.Tensor:
    keep = [j for j in range(matrix.shape[0]) if j != i]
    return matrix[keep][:, keep]


def signal_to_noise_interval(result: GradientVariance) -> tuple[float, float]:
    """95% jackknife interval (over rollouts) of a variant's per-rollout signal-to-noise."""
    gram = result.gram.double()
    n = gram.shape[0]
    return _jackknife_interval(_snr_of(gram), [_snr_of(_without(gram, i)) for i in range(n)])


def _cosine_of(cross: torch.Tensor, gram_a: torch.Tensor, gram_b: torch.Tensor) -> float:
    return float(cross.sum() / (gram_a.sum() * gram_b.sum()).sqrt())


def mean_cosine(a: GradientVariance, b: GradientVariance) -> tuple[float, float, float]:
    """Cosine between two variants' mean gradients over the same rollouts, with a 95% jackknife
    interval over rollouts (from the Gram matrices; the means still hold noise of size tr Cov / n,
    so a small signal-to-noise pulls the cosine towards the correlation of the two noises)."""
    cross = (a.flat @ b.flat.T).double()
    gram_a, gram_b = a.gram.double(), b.gram.double()
    n = cross.shape[0]
    point = _cosine_of(cross, gram_a, gram_b)
    low, high = _jackknife_interval(point, [_cosine_of(_without(cross, i), _without(gram_a, i), _without(gram_b, i)) for i in range(n)])
    return point, low, high


def gradient_variance(
    trainer, rollouts: int = 6, variants: dict[str, dict[str, object]] | None = None, progress=None
) -> list[GradientVariance]:
    """The variance of the update direction over `rollouts` independent steps, for each variant of
    settings (default: with and without MTE; keys "grpo.X" or "rollout.X", a bare name is a grpo
    setting), the same steps (prompts, seeds, plans) for every variant (paired). `progress`, when
    given, receives a line after each rollout (a variant's rollouts take minutes on a CPU)."""
    if rollouts < 2:
        raise ValueError(f"rollouts: got {rollouts}, expected >= 2 (a variance needs two samples)")
    variants = variants or DEFAULT_VARIANTS
    out = []
    for index, name in enumerate(variants, 1):
        rows = []
        with _variant_settings(trainer, variants, name):
            for step in range(rollouts):
                rows.append(torch.cat([g.flatten() for g in _step_gradient(trainer, step)]).double())
                if progress is not None:
                    progress(f"variant {index}/{len(variants)} ({name}): rollout {step + 1}/{rollouts}")
        flat = torch.stack(rows)
        mean = flat.mean(0)
        total = float((flat - mean).pow(2).sum(1).sum() / (rollouts - 1))
        sq = float(mean.pow(2).sum())
        signal = sq - total / rollouts
        out.append(GradientVariance(name, rollouts, sq, total, total / max(sq, 1e-300), signal, gram=flat @ flat.T, flat=flat))
    return out


DEFAULT_VARIANTS: dict[str, dict[str, object]] = {"with MTE": {"mte": True}, "without MTE": {"mte": False}}


@contextlib.contextmanager
def _variant_settings(trainer, variants: dict[str, dict[str, object]], name: str):
    """The trainer's config with variant `name`'s settings ("rollout.X" or "grpo.X"; a bare name is a
    grpo setting) and every other variant's keys at the config's own values; restored on exit."""

    def target(key: str):
        section, _, field_name = key.rpartition(".")
        return getattr(trainer.config, section or "grpo"), field_name

    saved = {key: getattr(*target(key)) for change in variants.values() for key in change}
    try:
        for key, value in {**saved, **variants[name]}.items():
            setattr(*target(key), value)
        yield
    finally:
        for key, value in saved.items():
            setattr(*target(key), value)


@dataclass
class DirectionGains:
    """The held-in reward gain of one step along a variant's update direction, per rollout."""

    variant: str
    eta: float
    direction: str  # "sign" (Adam's first step) or "rms" (the gradient scaled to unit RMS)
    gains: list[float]  # per rollout i: mean over fresh samples of R(theta - eta d_i) - R(theta)

    def mean_interval(self) -> tuple[float, float, float]:
        """Mean gain over the rollouts and its 95% t-interval."""
        return _t_interval(self.gains)


def _t_interval(values: list[float]) -> tuple[float, float, float]:
    from .ablate import seed_stats

    stats = seed_stats(values)
    return stats["mean"], stats["mean"] - stats["ci95"], stats["mean"] + stats["ci95"]


def paired_gain_difference(a: DirectionGains, b: DirectionGains) -> tuple[float, float, float]:
    """Mean of a's gain minus b's over the same rollouts, with its 95% paired t-interval."""
    return _t_interval([x - y for x, y in zip(a.gains, b.gains)])


def gain_ratio(a: DirectionGains, b: DirectionGains) -> tuple[float, float, float]:
    """mean gain of a / mean gain of b over the same rollouts, with a 95% jackknife interval."""
    n = len(a.gains)
    if n < 3 or len(b.gains) != n:
        raise ValueError("gain_ratio: needs two results over the same >= 3 rollouts")

    def ratio(keep: list[int]) -> float:
        return sum(a.gains[i] for i in keep) / sum(b.gains[i] for i in keep)

    estimate = ratio(list(range(n)))
    return (estimate, *_jackknife_interval(estimate, [ratio([j for j in range(n) if j != i]) for i in range(n)]))


def direction_gains(
    trainer,
    rollouts: int,
    variants: dict[str, dict[str, object]] | None = None,
    eta: float | None = None,
    direction: str = "sign",
    samples_per_prompt: int = 8,
    scan_seed: int = 987_654,
    progress=None,
    first_step: int = 0,
) -> list[DirectionGains]:
    """For each of `rollouts` independent steps (the trainer's steps first_step, first_step + 1, ...:
    prompts, seeds, plans)
    and each variant of settings, the update direction of that step's rollout, one step of size eta
    along it, and the change of the mean reward of fresh samples of the step's prompts (seed
    scan_seed + i, the same for every variant and the unmoved policy: paired). The mean over rollouts
    is the expected reward gain of one update along the variant's direction: a comparison of
    estimators by their usable signal, which the eval noise barely blurs (common samples), unlike the
    gradient's signal-to-noise over a few rollouts. eta None: the trainer's learning rate (with
    direction "sign", Adam's first step). Weights and optimizer are restored; `progress`,
    when given, is called with a line after each rollout."""
    if rollouts < 3:
        raise ValueError(f"rollouts: got {rollouts}, expected >= 3 (an interval over rollouts)")
    if direction not in ("sign", "rms"):
        raise ValueError(f"direction: got {direction!r}, expected 'sign' or 'rms'")
    from .step import step_metadata, step_prompts

    variants = variants or DEFAULT_VARIANTS
    eta = trainer.config.optim.lr if eta is None else eta
    params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    start = [p.detach().clone() for p in params]
    gains: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for step in range(first_step, first_step + rollouts):
            prompts = step_prompts(trainer, step)[0]
            metadata = step_metadata(trainer, step)
            unique, unique_meta = _distinct_prompts(prompts, metadata)
            base = _fresh_rewards(trainer, unique, samples_per_prompt, scan_seed + step, unique_meta)
            for name in variants:
                with _variant_settings(trainer, variants, name):
                    grads = _step_gradient(trainer, step)
                if direction == "sign":
                    moves = [g.sign() for g in grads]
                else:
                    rms = torch.cat([g.flatten() for g in grads]).pow(2).mean().sqrt().clamp_min(1e-30)
                    moves = [g / rms for g in grads]
                with torch.no_grad():
                    for p, p0, d in zip(params, start, moves):
                        p.copy_(p0 - eta * d)  # the loss decreases along -gradient
                moved = _fresh_rewards(trainer, unique, samples_per_prompt, scan_seed + step, unique_meta)
                with torch.no_grad():
                    for p, p0 in zip(params, start):
                        p.copy_(p0)
                gains[name].append(float((moved - base).mean()))
            if progress is not None:
                latest = ", ".join(f"{name} {values[-1]:+.4f}" for name, values in gains.items())
                progress(f"rollout {step - first_step + 1}/{rollouts} (step {step}): {latest}")
    finally:
        with torch.no_grad():
            for p, p0 in zip(params, start):
                p.copy_(p0)
    return [DirectionGains(name, eta, direction, values) for name, values in gains.items()]


def diagnose(trainer, etas=(0.0, 1e-4, 3e-4, 1e-3, 3e-3), samples_per_prompt: int = 8, scan_seed: int = 987_654) -> Diagnosis:
    """Run the four checks on the trainer's next step (its prompts and seeds); the policy's weights
    are restored afterwards and its optimizer is not touched."""
    prompts, rollout = trainer.rollout(trainer.step)
    metadata = trainer.step_metadata(trainer.step)
    rewards = trainer.reward(rollout.images, prompts, metadata).total.float()
    diagnosis = Diagnosis(
        recorded_logp_error=recorded_logp_error(rollout),
        first_update_log_ratio=first_update_log_ratio(trainer, rollout),
        zero_variance_fraction=zero_variance_fraction(rewards, trainer.config.grpo.group_size),
        train_reward=float(rewards.mean()),
        grad_norm=float("nan"),
    )

    grads = _step_gradient(trainer, trainer.step)  # the same step: same prompts, seeds and plan
    params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    diagnosis.grad_norm = float(torch.cat([g.flatten() for g in grads]).norm())
    flat = torch.cat([g.flatten() for g in grads])
    rms = flat.pow(2).mean().sqrt().clamp_min(1e-30)
    directions = {"gradient (unit RMS)": [g / rms for g in grads], "gradient sign (Adam's first step)": [g.sign() for g in grads]}
    unique, unique_meta = _distinct_prompts(prompts, metadata)
    start = [p.detach().clone() for p in params]
    try:
        for name, direction in directions.items():
            per_eta = []
            for eta in etas:
                with torch.no_grad():
                    for p, p0, d in zip(params, start, direction):
                        p.copy_(p0 - eta * d)  # the loss decreases along -gradient
                per_eta.append(_fresh_rewards(trainer, unique, samples_per_prompt, scan_seed, unique_meta))
            base = per_eta[0]
            diffs = [r - base for r in per_eta]
            diagnosis.scans.append(
                StepScan(
                    direction=name,
                    etas=list(etas),
                    reward=[float(r.mean()) for r in per_eta],
                    gain=[float(d.mean()) for d in diffs],
                    gain_se=[float(d.std(unbiased=True) / math.sqrt(d.numel())) if d.numel() > 1 else 0.0 for d in diffs],
                )
            )
    finally:
        with torch.no_grad():
            for p, p0 in zip(params, start):
                p.copy_(p0)
    return diagnosis


def main(argv: list[str] | None = None) -> int:
    """margrpo diagnose --config FILE [--etas ...] [key=value ...]: the four checks on one step."""
    from .trainer import Trainer

    parser = argparse.ArgumentParser(prog="margrpo diagnose", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument(
        "--etas", default="0,1e-4,3e-4,1e-3,3e-3", help="step sizes along each direction, comma-separated; the first should be 0"
    )
    parser.add_argument("--samples", type=int, default=8, help="fresh samples per prompt for each step size")
    parser.add_argument(
        "--variance", type=int, default=0, metavar="N", help="also the policy-gradient variance over N rollouts, with and without MTE"
    )
    parser.add_argument(
        "--compare",
        metavar="grpo.KEY=A,B",
        default=None,
        help="with --variance or --gains: the variants compared (default grpo.mte=true,false), e.g. grpo.group_noise=independent,common",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=V[,KEY=V]",
        help="with --variance or --gains, repeatable (instead of --compare): a named set of grpo./rollout. "
        "settings, e.g. mte:grpo.mte=true; each is compared with the first",
    )
    parser.add_argument(
        "--gains",
        type=int,
        default=0,
        metavar="N",
        help="also the reward gain of one step along each variant's direction, over N rollouts (paired fresh samples)",
    )
    parser.add_argument(
        "--gain-eta",
        type=float,
        default=None,
        help="with --gains: the step size along the direction (default: optim.lr, Adam's first step)",
    )
    parser.add_argument("--gains-from", type=int, default=0, metavar="S", help="with --gains: the first step (other rollouts)")
    parser.add_argument(
        "--gain-direction", choices=("sign", "rms"), default="sign", help="with --gains: sign (Adam's first step) or unit RMS"
    )
    parser.add_argument("--skip-checks", action="store_true", help="only the measurements asked for (--variance, --gains)")
    parser.add_argument(
        "--self-consistency",
        action="store_true",
        help="also the head's denoising error on the policy's tokens vs data tokens (ShapesWorld)",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    variants = None
    if args.compare:
        key, _, values = args.compare.partition("=")
        setting = key.removeprefix("grpo.")
        if not values or setting not in {f.name for f in dataclasses.fields(GRPOConfig)}:
            parser.error(f"--compare: got {args.compare!r}, expected grpo.KEY=A,B with KEY a grpo setting")
        variants = {f"{setting}={v}": {setting: yaml.safe_load(v)} for v in values.split(",")}
    if args.variant:
        variants = {}
        for spec in args.variant:
            name, _, settings = spec.partition(":")
            change = {}
            for item in filter(None, re.split(r",(?![^\[]*\])", settings)):  # commas inside [..] stay
                key, _, value = item.partition("=")
                section, _, field_name = key.rpartition(".")
                known = {"grpo": GRPOConfig, "rollout": RolloutConfig}.get(section or "grpo")
                if not value or known is None or field_name not in {f.name for f in dataclasses.fields(known)}:
                    parser.error(f"--variant: got {item!r} in {spec!r}, expected grpo.KEY=V or rollout.KEY=V")
                change[key] = yaml.safe_load(value)
            variants[name] = change
        if len(variants) < 2:
            parser.error("--variant: give at least two")
    etas = [float(x) for x in args.etas.split(",") if x.strip()]
    if not etas or etas[0] != 0.0:
        parser.error(f"--etas: got {args.etas!r}, expected a comma list starting with 0 (the baseline)")
    trainer = Trainer.from_files(args.config, args.overrides + ["run.resume=never"], create_run_dir=False)
    if not args.skip_checks:
        print(diagnose(trainer, etas, args.samples).table())
    if args.self_consistency:
        if not hasattr(trainer.policy, "encode_images"):
            parser.error("--self-consistency: needs a backbone with encode_images (the tiny ShapesWorld model)")
        from margrpo.testbed.render import render_batch

        prompts, rollout = trainer.rollout(trainer.step)
        size = trainer.policy.config.image_size
        data = trainer.policy.encode_images(render_batch(prompts, 12_345, size).to(rollout.tokens.device))
        print(head_self_consistency(trainer, rollout, data).table())
    if args.variance:
        print(f"policy-gradient variance over {args.variance} rollouts (same rollouts for each variant):")
        print(
            f"  {'variant':<22} {'|mean g|^2':>11} {'tr Cov':>11} {'relative':>9} {'|E g|^2 est':>12}"
            f" {'SNR':>9} {'SNR 95% (jackknife)':>22}"
        )
        results = gradient_variance(trainer, args.variance, variants, progress=lambda line: print(line, file=sys.stderr, flush=True))
        for v in results:
            snr_low, snr_high = signal_to_noise_interval(v)
            print(
                f"  {v.variant:<22} {v.mean_sq_norm:>11.4g} {v.total_variance:>11.4g} {v.relative_variance:>9.3f}"
                f" {v.signal_sq_norm:>12.4g} {v.signal_to_noise:>9.4f} [{snr_low:>9.4f}, {snr_high:>9.4f}]"
            )
        base = results[0]
        for other in results[1:]:
            ratio, low, high = variance_ratio(other, base)
            cosine, c_low, c_high = mean_cosine(other, base)
            print(
                f"  {other.variant} vs {base.variant}: tr Cov ratio {ratio:.3f} [{low:.3f}, {high:.3f}] (95% paired "
                f"bootstrap), cosine of the mean gradients {cosine:.3f} [{c_low:.3f}, {c_high:.3f}] (95% jackknife)"
            )
    if args.gains:
        gains = direction_gains(
            trainer,
            args.gains,
            variants,
            args.gain_eta,
            args.gain_direction,
            args.samples,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            first_step=args.gains_from,
        )
        print(gains_table(gains))
    return 0


def gains_table(results: list[DirectionGains]) -> str:
    """The --gains report: each variant's mean gain, and against the first variant the paired
    difference and the ratio of mean gains, each with its 95% interval."""
    first = results[0]
    lines = [
        f"reward gain of one step (eta {first.eta:g}, {first.direction} direction) over {len(first.gains)} rollouts, "
        "fresh samples paired with the unmoved policy:",
        f"  {'variant':<22} {'mean gain':>10} {'95% interval':>22} {'vs ' + first.variant:>34} {'ratio':>24}",
    ]
    for result in results:
        mean, low, high = result.mean_interval()
        versus = ratio = ""
        if result is not first:
            diff, d_low, d_high = paired_gain_difference(result, first)
            r, r_low, r_high = gain_ratio(result, first)
            versus, ratio = f"{diff:+.4f} [{d_low:+.4f}, {d_high:+.4f}]", f"{r:.2f} [{r_low:.2f}, {r_high:.2f}]"
        lines.append(f"  {result.variant:<22} {mean:>+10.4f} [{low:>+9.4f}, {high:>+9.4f}] {versus:>34} {ratio:>24}")
    lines.append("  per rollout: " + "; ".join(f"{r.variant}: " + " ".join(f"{g:+.4f}" for g in r.gains) for r in results))
    return "\n".join(lines)
