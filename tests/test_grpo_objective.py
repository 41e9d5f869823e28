"""The terms of the GRPO loss and what update() does around them, each against a computation written
here in float64: the token and KL weights (token_mean, sample_mean, per-update groups), the KL term's
value and gradient for every kind, the images an update leaves out (`samples`, drop_zero_variance),
gradient clipping, and which updates rescore their old log-probs (ratio 1 on-policy)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_float64_mar

from margrpo.grpo import GRPOConfig, update
from margrpo.grpo.objective import chunk_loss
from margrpo.grpo.policy_update import minibatches, rescores_old, update_weights
from margrpo.rollout import RecordPlan, RolloutConfig, generate

F64 = torch.float64
PROMPTS = ["a red circle", "a blue square", "a red circle", "a green triangle"]
PLAN = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((0, 3), (1, 4), (0, 2)))


@pytest.fixture(scope="module")
def tiny():
    model = tiny_float64_mar(7)
    for p in model.trainable_parameters():
        p.requires_grad_(True)
    config = RolloutConfig(
        num_mask_steps=5,
        schedule="harmon",
        cfg_scale=2.5,
        num_seeds=2,
        record_mask_steps=3,
        record_diffusion_steps=2,
        likelihood_positions="unknown",
    )
    rollout = generate(model, PROMPTS, config, [31, 32, 33, 34], sampler=model.make_sampler(), plan=PLAN)
    return model, rollout


class SummedGradients(torch.optim.SGD):
    """SGD at lr 0 that adds up the gradients of every step it takes (parameters stay put)."""

    def __init__(self, params):
        self.params = list(params)
        super().__init__(self.params, lr=0.0)
        self.total = [torch.zeros_like(p) for p in self.params]

    def step(self, closure=None):
        for total, p in zip(self.total, self.params):
            if p.grad is not None:
                total += p.grad
        return super().step(closure)


def _gradient(model, rollout, advantages, config, **kwargs):
    policy = copy.deepcopy(model)
    optimizer = SummedGradients(policy.trainable_parameters())
    result = update(policy, None, rollout, advantages, config, optimizer, grad_clip=1e9, **kwargs)
    assert result.skipped is None
    return optimizer.total, result


# ---------------------------------------------------------------- weights
def test_policy_and_kl_weights_follow_their_aggregation(tiny):
    _, rollout = tiny
    B, L = rollout.batch_size, rollout.num_transitions
    gen = torch.Generator().manual_seed(0)
    keep = torch.rand(B, L, 1, generator=gen) < torch.tensor([0.9, 0.5, 0.2, 0.0])[:, None, None]  # image 3 keeps nothing
    for aggregation in ("token_mean", "sample_mean"):
        config = GRPOConfig(aggregation=aggregation)
        weights, kl_weights = update_weights(rollout, keep, config, minibatches(rollout, config))
        counts = keep.sum((1, 2)).tolist()
        for b in range(B):
            if aggregation == "token_mean":
                expected = keep[b].to(F64) / sum(counts)
            else:  # every image that keeps a token weighs the same, split evenly over its tokens
                images = sum(1 for c in counts if c > 0)
                expected = keep[b].to(F64) / max(counts[b], 1) / images
            torch.testing.assert_close(weights[b], expected, rtol=1e-12, atol=0)
        # the KL: a uniform mean over every transition of the batch, whatever the selection
        torch.testing.assert_close(kl_weights, torch.full((B, L), 1.0 / (B * L), dtype=F64), rtol=1e-12, atol=0)


def test_per_update_normalisation_makes_each_update_sum_to_one(tiny):
    _, rollout = tiny
    config = GRPOConfig(normalization="update", minibatch_over="mask_steps", minibatches=3, aggregation="sample_mean")
    batches = minibatches(rollout, config)
    keep = torch.ones(rollout.batch_size, rollout.num_transitions, 1, dtype=torch.bool)
    weights, kl_weights = update_weights(rollout, keep, config, batches)
    assert len(batches) == 3
    for minibatch in batches:
        ((images, steps),) = minibatch
        cols = rollout.columns(steps)
        part = kl_weights[images][:, cols]
        torch.testing.assert_close(part, torch.full_like(part, 1.0 / part.numel()), rtol=1e-12, atol=0)
        per_image = weights[images][:, cols].sum((1, 2))
        torch.testing.assert_close(per_image, torch.full_like(per_image, 1.0 / len(images)), rtol=1e-12, atol=0)


# ---------------------------------------------------------------- the KL term
def _kl_inputs(gen, T=2, B=3, L=5, C=4):
    logp = torch.randn(T, B, L, generator=gen, dtype=F64, requires_grad=True)
    mean = torch.randn(T, B, L, C, generator=gen, dtype=F64, requires_grad=True)
    ref_mean = mean.detach() + 0.3 * torch.randn(T, B, L, C, generator=gen, dtype=F64)
    ref_logp = logp.detach() + 0.3 * torch.randn(T, B, L, generator=gen, dtype=F64)
    std = torch.rand(T, B, L, C, generator=gen, dtype=F64) + 0.5
    kl_weights = torch.rand(B, L, generator=gen, dtype=F64)
    return logp, mean, ref_mean, ref_logp, std, kl_weights / kl_weights.sum()


@pytest.mark.parametrize("kind", ["gaussian", "k3_logp", "parity_mean_k3"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_kl_term_value_and_gradient(gen, kind, reduction):
    """beta * sum_transitions w * KL on trajectory 0, with its gradient reaching logp (k3) or the
    means (the others); the policy term weighs nothing here (zero token weights)."""
    logp, mean, ref_mean, ref_logp, std, kl_weights = _kl_inputs(gen)
    C, beta = mean.shape[-1], 0.7
    out = chunk_loss(
        logp,
        logp.detach(),
        torch.zeros(3, dtype=F64),
        torch.zeros(3, 5, dtype=F64),
        mte_mask=None,
        clip_eps=0.2,
        clip_eps_high=None,
        kl_beta=beta,
        kl_type=kind,
        kl_weights=kl_weights,
        mean=mean,
        ref_mean=ref_mean,
        std=std,
        ref_logp=ref_logp,
        channel_reduction=reduction,
    )
    scale = 1.0 if reduction == "sum" else 1.0 / C
    if kind == "gaussian":
        per_channel = (mean[0] - ref_mean[0]) ** 2 / (2 * std[0] ** 2)
        per = per_channel.sum(-1) * scale
    elif kind == "parity_mean_k3":
        d = ref_mean[0] - mean[0]
        per = (torch.exp(d) - d - 1).sum(-1) * scale
    else:  # k3 of the (reduced) log-probs: r - 1 - log r with r = p_ref / p
        log_r = (ref_logp[0] - logp[0]) * scale
        per = torch.exp(log_r) - 1 - log_r
    expected = beta * (kl_weights * per).sum()
    torch.testing.assert_close(out.loss.double(), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out.kl.double(), expected / beta, rtol=1e-5, atol=1e-7)
    got = torch.autograd.grad(out.loss, (logp, mean), allow_unused=True, materialize_grads=True)
    want = torch.autograd.grad(expected, (logp, mean), allow_unused=True, materialize_grads=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-7)
    assert sum(float(w.abs().sum()) for w in want) > 0


def test_kl_term_is_a_mean_whatever_the_batch_shape(gen):
    """Uniform KL weights over B x L transitions make the KL a mean: repeating the batch leaves it
    unchanged (a term that shrinks with the number of transitions would halve)."""
    logp, mean, ref_mean, _, std, _ = _kl_inputs(gen)
    B, L = logp.shape[1:]

    def kl(reps):
        def rep(x):
            return x.repeat(1, reps, *([1] * (x.dim() - 2)))

        out = chunk_loss(
            rep(logp),
            rep(logp).detach(),
            torch.zeros(B * reps, dtype=F64),
            torch.zeros(B * reps, L, dtype=F64),
            mte_mask=None,
            clip_eps=0.2,
            clip_eps_high=None,
            kl_beta=1.0,
            kl_weights=torch.full((B * reps, L), 1.0 / (B * reps * L), dtype=F64),
            mean=rep(mean),
            ref_mean=rep(ref_mean),
            std=rep(std),
        )
        return out.kl

    expected = ((mean[0] - ref_mean[0]) ** 2 / (2 * std[0] ** 2)).sum(-1).mean()
    torch.testing.assert_close(kl(1).double(), expected, rtol=1e-5, atol=0)
    torch.testing.assert_close(kl(2).double(), expected, rtol=1e-5, atol=0)


# ---------------------------------------------------------------- which images an update trains on
@pytest.mark.parametrize("aggregation", ["token_mean", "sample_mean"])
def test_left_out_images_leave_the_normaliser(tiny, aggregation):
    """update(samples=...) is the update of the rollout without those images (no KL here)."""
    model, rollout = tiny
    advantages = torch.tensor([0.9, -0.4, 0.3, -0.8], dtype=F64)
    config = GRPOConfig(kl_beta=0.0, aggregation=aggregation, mte=True, consistency=True, consistency_start_step=0)
    samples = torch.tensor([True, False, True, True])
    got, _ = _gradient(model, rollout, advantages, config, samples=samples)
    rows = samples.nonzero().flatten()
    want, _ = _gradient(model, rollout.select(rows), advantages[rows], config)
    full, _ = _gradient(model, rollout, advantages * samples, config)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-13)
    # zeroing the advantage alone keeps the image in the normaliser: another gradient
    assert any(not torch.allclose(f, w, rtol=1e-6, atol=0) for f, w in zip(full, want))
    with pytest.raises(ValueError, match=r"samples: got shape \(3,\), expected \(4,\)"):
        _gradient(model, rollout, advantages, config, samples=samples[:3])


# ---------------------------------------------------------------- gradient clipping
def test_each_optimizer_step_sees_the_gradient_clipped_to_grad_clip(tiny):
    model, rollout = tiny
    advantages = torch.tensor([0.9, -0.4, 0.3, -0.8], dtype=F64)
    config = GRPOConfig(kl_beta=0.0)
    raw, _ = _gradient(model, rollout, advantages, config)
    raw_norm = float(torch.cat([g.flatten() for g in raw]).norm())
    for clip in (raw_norm / 10, raw_norm * 10):
        policy = copy.deepcopy(model)
        params = policy.trainable_parameters()
        before = [p.detach().clone() for p in params]
        result = update(policy, None, rollout, advantages, config, torch.optim.SGD(params, lr=1.0), grad_clip=clip)
        step = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, params)])  # lr 1: the gradient used
        assert result.metrics["grad_norm"] == pytest.approx(raw_norm, rel=1e-9)  # the norm before clipping
        expected = torch.cat([g.flatten() for g in raw]) * min(1.0, clip / raw_norm)
        torch.testing.assert_close(step, expected, rtol=1e-5, atol=1e-12)


# ---------------------------------------------------------------- old log-probs
def test_which_updates_rescore_their_old_logprobs(tiny):
    model, rollout = tiny
    assert rollout.config.uses_cfg
    assert not rescores_old(model, rollout, GRPOConfig(), bf16=False)  # same numerics and guidance
    assert rescores_old(model, rollout, GRPOConfig(), bf16=True)  # autocast
    assert rescores_old(copy.deepcopy(model).to(torch.bfloat16), rollout, GRPOConfig(), bf16=False)  # half weights
    assert rescores_old(model, rollout, GRPOConfig(likelihood_cfg="none"), bf16=False)  # another guidance
    assert not rescores_old(model, rollout, GRPOConfig(objective="reinforce"), bf16=True)  # no ratio


@pytest.mark.parametrize(
    "switches",
    [
        dict(likelihood_cfg="none"),
        dict(likelihood_cfg="none", pixels_per_token=2, micro_batches=2, micro_batch_over="mask_steps"),
        dict(likelihood_cfg="none", likelihood_std="recorded_main", minibatch_over="mask_steps", minibatches=3),
        dict(likelihood_cfg="none", mte=True, minibatches=2),
    ],
)
def test_rescored_old_logprobs_make_the_first_update_on_policy(tiny, switches):
    """The unguided likelihood scores another policy than the guided rollout: its first update must
    still see ratio 1 (per-pixel log-probs and the recorded std included, which rebuild the old
    log-probs from the means; under MTE the seed trajectories at the MTE tokens, rescored there alone)."""
    model, rollout = tiny
    config = GRPOConfig(kl_beta=0.0, **switches)
    _, result = _gradient(model, rollout, torch.tensor([0.9, -0.4, 0.3, -0.8], dtype=F64), config)
    assert result.metrics["ratio_max"] == pytest.approx(1.0, abs=1e-9)
    assert result.metrics["approx_kl"] == pytest.approx(0.0, abs=1e-12)
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-9)  # weights sum to 1 over the batch


def test_a_single_optimizer_step_divides_by_its_own_forward(tiny):
    """One optimizer step per update: old log-probs that need rescoring come from the loss's own
    forward, detached. No forward runs without gradient, the ratio is exactly 1 and the gradient is
    the plain policy gradient (the reinforce objective's); with several steps the update rescores."""
    model, rollout = tiny
    advantages = torch.tensor([0.9, -0.4, 0.3, -0.8], dtype=F64)
    model = copy.deepcopy(model)
    grad_modes: list[bool] = []
    block = next(m for m in model.modules() if type(m).__name__ == "Block")  # every forward_z runs it
    block.register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    config = GRPOConfig(kl_beta=0.0, likelihood_cfg="none")
    got, result = _gradient(model, rollout, advantages, config)
    assert grad_modes and all(grad_modes)
    assert result.metrics["ratio_max"] == 1.0 and result.metrics["clip_fraction"] == 0.0
    want, _ = _gradient(model, rollout, advantages, GRPOConfig(kl_beta=0.0, likelihood_cfg="none", objective="reinforce"))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    grad_modes.clear()
    _gradient(model, rollout, advantages, GRPOConfig(kl_beta=0.0, likelihood_cfg="none", minibatches=3, minibatch_over="mask_steps"))
    assert False in grad_modes and True in grad_modes  # the rescoring forwards, then the loss's


# ---------------------------------------------------------------- the metrics of several epochs
def test_metrics_are_means_over_inner_epochs(tiny):
    """At lr 0 every epoch sees the same loss: the metrics of 3 epochs are those of 1 (on-policy:
    ratio_mean 1, the token weights summing to 1), and each epoch takes its optimizer step."""
    model, rollout = tiny
    advantages = torch.tensor([0.9, -0.4, 0.3, -0.8], dtype=F64)
    _, one = _gradient(model, rollout, advantages, GRPOConfig(kl_beta=0.0, minibatches=2))
    _, three = _gradient(model, rollout, advantages, GRPOConfig(kl_beta=0.0, minibatches=2, inner_epochs=3))
    assert one.metrics["updates"] == 2 and three.metrics["updates"] == 6
    assert three.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-9)
    assert one.metrics["policy"] != 0
    for key in ("loss", "policy", "kl", "clip_fraction", "approx_kl", "ratio_mean"):
        assert three.metrics[key] == pytest.approx(one.metrics[key], rel=1e-9, abs=1e-15), key
