"""margrpo.grpo.update and the rollout layout it reads: the update's gradient equals a plain-torch
recomputation of the full-batch GRPO loss (float64 TinyMAR), chunked losses equal the formula the
loss had before token weights were normalised only once, and the Rollout's chunk bookkeeping."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from conftest import tiny_float64_mar

from margrpo import ops
from margrpo.grpo import GRPOConfig, update
from margrpo.grpo.objective import chunk_loss
from margrpo.rollout import RecordPlan, RolloutConfig, generate, rollout_logprob

F64 = torch.float64
PROMPTS = ["a red circle", "a blue square", "a red circle", "a green triangle"]
# 16 tokens, 5 Harmon mask steps reveal (1, 3, 3, 5, 4) tokens
PLAN = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((0, 3), (1, 4), (0, 2)))


@pytest.fixture(scope="module")
def tiny():
    model = tiny_float64_mar(3, train_backbone=True)
    return model, model.make_sampler()


def _rollout(model, sampler, plan=PLAN, seed_selection=None, **overrides):
    values = dict(
        num_mask_steps=5,
        schedule="harmon",
        cfg_scale=2.5,
        num_seeds=2,
        record_mask_steps=3,
        record_diffusion_steps=2,
        likelihood_positions="unknown",
    )
    config = RolloutConfig(**{**values, **overrides})
    return generate(model, PROMPTS, config, [11, 12, 13, 14], sampler=sampler, plan=plan, seed_selection=seed_selection)


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


def _plain_selection(rollout, config: GRPOConfig):
    """keep, mte [B, L] from the definitions (not margrpo.grpo.selection)."""
    B, M, N = rollout.batch_size, rollout.plan.num_mask_steps, rollout.num_tokens
    positions = rollout.l_positions()  # [B, L]
    keep = torch.ones_like(positions, dtype=torch.bool)
    if config.consistency:
        cos = torch.nn.functional.cosine_similarity
        per_step = torch.ones(B, M, N, dtype=torch.bool)
        effective = [s for s, n in enumerate(rollout.reveal_counts) if n > 0]
        for j, step in enumerate(rollout.plan.mask_steps):
            if effective.index(step) < config.consistency_start_step:
                continue
            gain = cos(rollout.pred_clean[:, j], rollout.tokens, dim=-1) - cos(rollout.pred_clean_prev[:, j], rollout.tokens, dim=-1)
            start = sum(rollout.reveal_counts[:step])
            committed = torch.zeros(B, N, dtype=torch.bool)
            committed.scatter_(1, rollout.order[:, start : start + rollout.reveal_counts[step]], True)
            per_step[:, j] = (gain > config.consistency_threshold) | committed
        steps = rollout.l_step()  # [L]
        keep = per_step[torch.arange(B)[:, None], steps[None], positions]
    mte = None
    if config.mte:
        uncertainty = rollout.seed_tokens.std(0, unbiased=False).mean(-1)  # [B, N]
        k = int(config.mte_ratio * N)
        top = torch.zeros(B, N, dtype=torch.bool).scatter_(1, uncertainty.topk(k, dim=1).indices, True)
        mte = top.gather(1, positions)
    return keep, mte


def _plain_loss(policy, reference, rollout, advantages, config: GRPOConfig):
    """The full-batch MAR-GRPO loss written out: clipped ratio per trajectory, MTE mean over
    trajectories where selected, token weights over the batch, Gaussian KL on trajectory 0 (uniform
    weights over the batch's transitions)."""
    keep, mte = _plain_selection(rollout, config)
    lik = rollout_logprob(policy, rollout, cfg=config.likelihood_cfg)
    old = lik.logp.detach() if config.objective == "reinforce" else rollout.logp
    ratio = torch.exp(lik.logp - old)
    A = advantages[None, :, None]
    term = torch.maximum(-A * ratio, -A * ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps))
    per_token = term[0] if mte is None else torch.where(mte, term.mean(0), term[0])
    w = keep.to(F64)
    if config.aggregation == "token_mean":
        w = w / w.sum()
    else:
        w = w / w.sum(1, keepdim=True).clamp_min(1) / (w.sum(1) > 0).sum()
    policy_term = (w * per_token).sum()
    with torch.no_grad():
        ref = rollout_logprob(reference, rollout, cfg=config.likelihood_cfg)
    # per transition in float32 as margrpo.grpo.kl computes it, then the float64 mean
    per_transition = 0.5 * ((lik.mean[0].float() - ref.mean[0].float()) / rollout.std[0].float()).pow(2).sum(-1)
    kl = (per_transition * torch.full(per_transition.shape, 1 / per_transition.numel(), dtype=F64)).sum()
    return policy_term + config.kl_beta * kl, kl


@pytest.mark.parametrize(
    "switches",
    [
        dict(),
        dict(mte=True, consistency=True, consistency_start_step=0, aggregation="sample_mean", micro_batches=3),
        dict(mte=True, minibatch_over="mask_steps", minibatches=2, micro_batches=2, micro_batch_over="images"),
        dict(objective="reinforce", micro_batch_over="mask_steps", micro_batches=3),
    ],
)
def test_update_gradient_is_the_full_batch_loss_gradient(tiny, switches):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    policy = copy.deepcopy(model)
    reference = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():  # move the policy off the reference so the ratio and the KL are not trivial
        for p in policy.trainable_parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=F64))
    config = GRPOConfig(kl_beta=0.3, clip_eps=0.05, **switches)
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=F64)
    params = list(policy.trainable_parameters())
    optimizer = SummedGradients(params)
    result = update(policy, reference, rollout, advantages, config, optimizer, grad_clip=1e9)
    assert result.skipped is None and result.metrics["updates"] == config.minibatches

    policy.train()
    expected_loss, expected_kl = _plain_loss(policy, reference, rollout, advantages, config)
    expected = torch.autograd.grad(expected_loss, params)
    assert sum(float(g.abs().sum()) for g in expected) > 0
    for got, want in zip(optimizer.total, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert result.metrics["loss"] == pytest.approx(float(expected_loss), rel=1e-9, abs=1e-12)
    assert result.metrics["kl"] == pytest.approx(float(expected_kl), rel=1e-9) and expected_kl > 0


def test_only_the_trajectories_the_loss_reads_are_scored(tiny, monkeypatch):
    """The KL reads trajectory 0 (objective.chunk_loss), so the ref policy's likelihood scores that one
    alone while the policy scores all K + 1 under MTE (the seeds at the MTE positions only: the test
    below), and trajectory 0 alone without it (the numbers: the full-batch gradient test above, with
    and without MTE, the KL on)."""
    import importlib

    policy_update = importlib.import_module("margrpo.grpo.policy_update")
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    policy, reference = copy.deepcopy(model), copy.deepcopy(model).requires_grad_(False)
    scored: list[tuple[str, int]] = []
    original = policy_update.rollout_logprob

    def spy(backbone, part, **kwargs):
        seeds_everywhere = part.num_trajectories > 1 and kwargs.get("seed_positions") is None
        scored.append(("ref" if backbone is reference else "policy", part.num_trajectories, seeds_everywhere))
        return original(backbone, part, **kwargs)

    monkeypatch.setattr(policy_update, "rollout_logprob", spy)
    optimizer = torch.optim.SGD(list(policy.trainable_parameters()), lr=0.0)
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=F64)
    result = update(policy, reference, rollout, advantages, GRPOConfig(kl_beta=0.3, mte=True), optimizer)
    assert result.skipped is None and abs(result.metrics["kl"]) < 1e-12  # the policy is the ref policy
    assert rollout.num_trajectories == 3
    assert ("ref", 1, False) in scored and ("policy", 3, False) in scored  # the seeds at the MTE positions
    assert {trajectories for who, trajectories, _ in scored if who == "ref"} == {1}
    # without MTE nothing reads the seed trajectories: the policy scores trajectory 0 alone too
    scored.clear()
    update(policy, reference, rollout, advantages, GRPOConfig(kl_beta=0.3), optimizer)
    assert sorted(set(scored)) == [("policy", 1, False), ("ref", 1, False)]


def test_update_rejects_bad_arguments_and_skips_non_finite_losses(tiny):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    policy = copy.deepcopy(model)
    optimizer = torch.optim.SGD(list(policy.trainable_parameters()), lr=0.1)
    with pytest.raises(ValueError, match=r"advantages: got shape \(3,\), expected \(4,\)"):
        update(policy, None, rollout, torch.zeros(3, dtype=F64), GRPOConfig(kl_beta=0.0), optimizer)
    with pytest.raises(ValueError, match="ref_policy: got None with grpo.kl_beta=0.01"):
        update(policy, None, rollout, torch.zeros(4, dtype=F64), GRPOConfig(), optimizer)
    nan = torch.tensor([1.0, float("nan"), 0.0, 0.0], dtype=F64)
    with pytest.raises(ValueError, match="advantages: got 1 non-finite values of 4"):
        update(policy, None, rollout, nan, GRPOConfig(kl_beta=0.0), optimizer)
    before = [p.clone() for p in policy.trainable_parameters()]
    broken = rollout.with_update_values(old_logp=torch.full_like(rollout.logp, float("nan")))  # a NaN ratio
    result = update(policy, None, broken, torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=F64), GRPOConfig(kl_beta=0.0), optimizer)
    assert result.skipped == "loss" and result.metrics == {}
    assert all(torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters()))


def _old_chunk_loss(logp, old, advantages, weights, mte, clip_eps):
    """The policy term as computed before (frozen here): each chunk renormalised its slice of the
    batch token weights to sum 1, then the loss and statistics were scaled back by the slice's share."""
    share = weights.sum()
    w = weights / share
    ratio = torch.exp(logp - old)
    A = advantages[None, :, None]
    term = torch.maximum(-A * ratio, -A * ratio.clamp(1 - clip_eps, 1 + clip_eps))
    per_token = torch.where(mte, term.mean(0), term[0])
    clipped = (-A * ratio.clamp(1 - clip_eps, 1 + clip_eps)) > -A * ratio
    traj = torch.where(
        mte[None], torch.full_like(ratio, 1 / ratio.shape[0]), (torch.arange(ratio.shape[0]) == 0).to(ratio)[:, None, None].expand_as(ratio)
    )
    clip_fraction = (w[None] * traj * clipped).sum() * share
    return (w * per_token).sum() * share, clip_fraction


def test_chunk_losses_equal_the_previous_per_chunk_renormalised_formula():
    gen = torch.Generator().manual_seed(0)
    T, B, L = 3, 4, 10
    logp = torch.randn(T, B, L, generator=gen, dtype=F64, requires_grad=True)
    old = logp.detach() + 0.3 * torch.randn(T, B, L, generator=gen, dtype=F64)
    advantages = torch.randn(B, generator=gen, dtype=F64)
    keep = torch.rand(B, L, generator=gen) > 0.3
    mte = torch.rand(B, L, generator=gen) > 0.5
    weights = ops.token_weights(keep, "sample_mean", F64)
    chunks = [(slice(0, 2), slice(0, 4)), (slice(0, 2), slice(4, L)), (slice(2, B), slice(None))]
    new_total, old_total, old_clip, new_clip = 0.0, 0.0, 0.0, 0.0
    for rows, cols in chunks:

        def cut(x):
            return x[..., rows, cols]

        out = chunk_loss(cut(logp), cut(old), advantages[rows], cut(weights), mte_mask=cut(mte), clip_eps=0.2, clip_eps_high=None)
        loss, clip = _old_chunk_loss(cut(logp), cut(old), advantages[rows], cut(weights), cut(mte), 0.2)
        new_total, old_total = new_total + out.loss, old_total + loss
        new_clip, old_clip = new_clip + out.clip_fraction, old_clip + clip
    torch.testing.assert_close(new_total, old_total, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(new_clip, old_clip, rtol=1e-12, atol=1e-14)
    (new_grad,) = torch.autograd.grad(new_total, logp)
    (old_grad,) = torch.autograd.grad(old_total, logp)
    torch.testing.assert_close(new_grad, old_grad, rtol=1e-12, atol=1e-14)
    assert new_grad.abs().sum() > 0


def test_token_weights_sum_to_one_and_sum_aggregation_keeps_the_weights():
    keep = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    token = ops.token_weights(keep, "token_mean", F64)
    torch.testing.assert_close(token, keep.to(F64) / 5)
    sample = ops.token_weights(keep, "sample_mean", F64)
    torch.testing.assert_close(sample.sum(1), torch.tensor([0.5, 0.0, 0.5], dtype=F64))
    weights = torch.rand(3, 3, dtype=F64)
    assert torch.equal(ops.token_weights(weights, "sum", F64), weights)
    with pytest.raises(ValueError, match="aggregation: got 'mean'"):
        ops.token_weights(keep, "mean")


# ---------------------------------------------------------------- the rollout's bookkeeping
@pytest.mark.parametrize("known_mask", ["pre_step", "post_step"])
def test_recorded_transitions_index_l_as_documented(tiny, known_mask):
    """l = offset_j + r * P_j + p: with consecutive recorded diffusion steps every chain continues
    from r to r + 1 at the same (trajectory, image, position), and each step's part of L holds
    R x P_j transitions."""
    model, sampler = tiny
    consecutive = RecordPlan(mask_steps=(0, 2, 3), diffusion_steps=((0, 1), (1, 2), (2, 3)))
    rollout = _rollout(model, sampler, plan=consecutive, known_mask=known_mask)
    T, B, L = rollout.logp.shape
    for j in range(3):
        P = rollout.slots[j].count
        part = rollout.l_slice(j)
        assert part.stop - part.start == 2 * P
        x_t, x_prev = (values[:, :, part].unflatten(2, (2, P)) for values in (rollout.x_t, rollout.x_prev))
        torch.testing.assert_close(x_prev[:, :, 0], x_t[:, :, 1], rtol=0, atol=0)  # step r's output is step r + 1's input
        assert not torch.equal(x_t[:, :, 0], x_t[:, :, 1])
    assert L == 2 * sum(rollout.slots[j].count for j in range(3)) and T == 3


def test_rollout_chunks_committed_masks_and_update_values(tiny):
    model, sampler = tiny
    rollout = _rollout(model, sampler)
    T, B, L = rollout.logp.shape
    assert rollout.num_transitions == L and rollout.num_trajectories == T == 3
    for j, step in enumerate(PLAN.mask_steps):
        start = sum(rollout.reveal_counts[:step])
        committed = rollout.committed(j)
        assert int(committed.sum()) == B * rollout.reveal_counts[step]
        for b in range(B):
            assert set(committed[b].nonzero().flatten().tolist()) == set(
                rollout.order[b, start : start + rollout.reveal_counts[step]].tolist()
            )
    assert [rollout.effective_index(j) for j in range(3)] == [0, 2, 3]

    columns = rollout.columns([2, 0])
    expected = [*range(rollout.l_slice(2).start, rollout.l_slice(2).stop), *range(rollout.l_slice(0).stop)]
    assert columns.tolist() == expected
    ref_logp = torch.randn(T, B, L, dtype=F64)
    old_logp = torch.randn(T, B, L, dtype=F64)
    scored = rollout.with_update_values(old_logp=old_logp, ref_logp=ref_logp, ref_mean=rollout.mean + 1)
    chunk = scored.chunk([3, 1], [2, 0])
    torch.testing.assert_close(chunk.old_logp, old_logp[:, [3, 1]][:, :, expected], rtol=0, atol=0)
    torch.testing.assert_close(chunk.ref_logp, ref_logp[:, [3, 1]][:, :, expected], rtol=0, atol=0)
    torch.testing.assert_close(chunk.std, rollout.std[:, [3, 1]][:, :, expected], rtol=0, atol=0)
    torch.testing.assert_close(chunk.ref_mean, rollout.mean[:, [3, 1]][:, :, expected] + 1, rtol=0, atol=0)
    weights = torch.rand(B, L, dtype=F64)
    torch.testing.assert_close(chunk.take(weights), weights[[3, 1]][:, expected], rtol=0, atol=0)
    assert chunk.rollout.prompts == [PROMPTS[3], PROMPTS[1]]
    torch.testing.assert_close(chunk.rollout.logp, rollout.logp[:, [3, 1]], rtol=0, atol=0)
    assert scored.select([1]).ref_logp.shape == (T, 1, L)
    plain = rollout.chunk([0, 2])  # no update values: the recorded logp, no reference
    torch.testing.assert_close(plain.old_logp, rollout.logp[:, [0, 2]], rtol=0, atol=0)
    assert plain.ref_logp is None and plain.ref_mean is None
    with pytest.raises(ValueError, match=r"ref_logp: got shape \(3, 4\)"):
        rollout.with_update_values(ref_logp=torch.zeros(3, 4))
    # the ref values of trajectory 0 alone (all the KL reads) are taken; two trajectories of three
    # are not, nor one trajectory of the old values (the ratio reads every trajectory)
    main = rollout.with_update_values(ref_logp=ref_logp[:1], ref_mean=rollout.mean[:1] + 1)
    torch.testing.assert_close(main.chunk([3, 1], [2, 0]).ref_logp, ref_logp[:1, [3, 1]][:, :, expected], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"ref_logp: got shape \(2, 4, "):
        rollout.with_update_values(ref_logp=ref_logp[:2])
    with pytest.raises(ValueError, match=r"old_logp: got shape \(1, 4, "):
        rollout.with_update_values(old_logp=old_logp[:1])
    cut = scored.main_trajectory()  # every per-transition field set, trajectory 0 of each
    for name in ("x_t", "x_prev", "mean", "std", "logp", "old_logp", "ref_logp", "ref_mean"):
        torch.testing.assert_close(getattr(cut, name), getattr(scored, name)[:1], rtol=0, atol=0, msg=name)
    assert cut.old_mean is None and cut.num_trajectories == 1 and torch.equal(cut.seed_tokens, scored.seed_tokens)
    with pytest.raises(ValueError, match=r"values: got shape \(4,\)"):
        chunk.take(torch.zeros(4))


def test_grpo_package_imports_no_model_or_trainer_code():
    """margrpo.grpo works on any MARBackbone and any training loop: no import of margrpo.models or
    margrpo.train in its modules."""
    import ast
    from pathlib import Path

    import margrpo.grpo

    for path in Path(margrpo.grpo.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            bad = [n for n in names if n.startswith(("margrpo.models", "margrpo.train"))]
            assert not bad, f"{path.name} imports {bad}"


def test_seed_positions_score_the_seeds_there_alone_and_keep_the_recorded_values_elsewhere(tiny, monkeypatch):
    """rollout_logprob(seed_positions=...) (what the update passes under MTE): trajectory 0 and the
    selected seed entries equal the full scoring in float64, values and gradients, under guidance;
    the other seed entries are the recorded ones, without gradient; the head runs the seeds only on
    the tokens with a selected transition."""
    from margrpo.rollout import likelihood as likelihood_module

    model, sampler = tiny
    rollout = _rollout(model, sampler)  # guidance 2.5, unknown positions, K = 2
    policy = copy.deepcopy(model)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() + 1), dtype=F64))
    B, L, T = rollout.batch_size, rollout.num_transitions, rollout.num_trajectories
    R = rollout.plan.num_diffusion_steps
    selected = torch.rand(B, L, generator=torch.Generator().manual_seed(3)) < 0.3  # differs across R within a token
    rows_scored: list[int] = []
    original = likelihood_module.transitions_logprob

    def spy(head, z, *args, **kwargs):
        rows_scored.append(kwargs["x_t"].shape[-2] * (kwargs["x_t"].shape[1] if kwargs["x_t"].dim() == 5 else 1))
        return original(head, z, *args, **kwargs)

    monkeypatch.setattr(likelihood_module, "transitions_logprob", spy)
    full = rollout_logprob(policy, rollout)
    rows_scored.clear()
    part = rollout_logprob(policy, rollout, seed_positions=selected)
    # per recorded step: trajectory 0 on every token, then the seeds on the tokens with a selected transition
    expected_rows = []
    for j in range(rollout.plan.num_mask_steps):
        tokens = selected[:, rollout.slots[j].columns].unflatten(1, (R, -1)).any(1)
        expected_rows += [tokens.numel(), int(tokens.sum())]
    assert rows_scored == expected_rows and 0 < sum(expected_rows[1::2]) < sum(expected_rows[0::2])

    read = torch.cat([torch.ones(1, B, L, dtype=torch.bool), selected.expand(T - 1, B, L)])
    torch.testing.assert_close(part.logp[read], full.logp[read], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(part.mean[read], full.mean[read], rtol=1e-12, atol=1e-12)
    assert torch.equal(part.logp[~read], rollout.logp[~read]) and torch.equal(part.mean[~read], rollout.mean[~read])
    weights = torch.randn(T, B, L, generator=torch.Generator().manual_seed(4), dtype=F64) * read
    params = list(policy.trainable_parameters())
    got = torch.autograd.grad((part.logp * weights).sum() + part.mean[read].sum(), params)
    want = torch.autograd.grad((full.logp * weights).sum() + full.mean[read].sum(), params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="seed_positions"):
        rollout_logprob(policy, rollout, seed_positions=selected[:, :-1])
    one_step = rollout_logprob(policy, rollout, steps=[1], seed_positions=selected[:, rollout.slots[1].columns])
    assert one_step.logp.shape == (T, B, rollout.slots[1].columns.stop - rollout.slots[1].columns.start)


def _mte_config(**switches) -> GRPOConfig:
    values = dict(kl_beta=0.3, clip_eps=0.05, mte=True, mte_ratio=0.4, consistency=True, consistency_start_step=0)
    return GRPOConfig(**{**values, **switches})


def test_deferred_seed_chains_draw_the_same_numbers_where_the_loss_reads_them(tiny, monkeypatch):
    """generate(seed_selection=mte_tokens(config)) (the trainer under MTE): trajectory 0, the image,
    the seed tokens and the predictions are the full rollout's bit for bit; the seed entries at the
    committed tokens and the MTE tokens equal it (float64), the others are trajectory 0's stand-ins,
    seed_recorded marks exactly the drawn ones, and the head runs the seeds past a recorded step's
    committed tokens only on the selected tokens."""
    from margrpo.grpo.selection import mte_mask, mte_tokens

    generate_module = importlib.import_module("margrpo.rollout.generate")
    model, sampler = tiny
    config = _mte_config()
    chains = {"full": 0, "deferred": 0}
    original = generate_module.multi_seed_denoise

    def counting(key):
        def spy(head, z, sampler, num_seeds, **kwargs):
            chains[key] += (num_seeds + 1) * kwargs["noise"].shape[2]  # chains run
            return original(head, z, sampler, num_seeds, **kwargs)

        return spy

    monkeypatch.setattr(generate_module, "multi_seed_denoise", counting("full"))
    full = _rollout(model, sampler)
    monkeypatch.setattr(generate_module, "multi_seed_denoise", counting("deferred"))
    deferred = _rollout(model, sampler, seed_selection=mte_tokens(config))
    monkeypatch.undo()
    for name in ("tokens", "seed_tokens", "images", "pred_clean", "pred_clean_prev", "order"):
        assert torch.equal(getattr(full, name), getattr(deferred, name)), name
    # expected: a seed entry is drawn when its token is committed at its step or selected by MTE
    selected = mte_mask(full.seed_tokens, config.mte_ratio).any(-1)  # [B, N]
    committed = full.l_committed()[None].expand(full.batch_size, -1)  # [B, L]
    expected = committed | selected.gather(1, full.l_positions())
    assert torch.equal(deferred.seed_recorded, expected) and 0 < int(expected.sum()) < expected.numel()
    for name in ("x_t", "x_prev", "mean", "std", "logp"):
        got, want = getattr(deferred, name), getattr(full, name)
        assert torch.equal(got[0], want[0]), name
        torch.testing.assert_close(got[1:][:, expected], want[1:][:, expected], rtol=1e-12, atol=1e-12)
        assert torch.equal(got[1:][:, ~expected], got[:1].expand_as(got[1:])[:, ~expected]), name
    # the seed chains left out: K for every unselected token past a recorded step's committed ones
    R, K = full.plan.num_diffusion_steps, full.num_trajectories - 1
    assert chains["full"] - chains["deferred"] == K * int((~expected).sum()) // R > 0


@pytest.mark.parametrize(
    "switches",
    [
        dict(),
        dict(minibatches=2, inner_epochs=2, likelihood_cfg="none"),
        dict(mte_ratio=0.05, mte_k="reference"),  # one token per image, where the floor rule takes none
    ],
)
def test_an_update_on_a_deferred_rollout_is_the_full_rollouts_update(tiny, switches):
    """The same MTE update (gradients of every optimizer step, metrics) on the rollout with deferred
    seed chains as on the fully drawn one, in float64; a rollout drawn for other tokens is refused."""
    from margrpo.grpo.selection import mte_tokens

    model, sampler = tiny
    config = _mte_config(**switches)
    results = []
    for rollout in (_rollout(model, sampler), _rollout(model, sampler, seed_selection=mte_tokens(config))):
        policy = copy.deepcopy(model)
        with torch.no_grad():
            for p in policy.trainable_parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=F64))
        optimizer = SummedGradients(list(policy.trainable_parameters()))
        reference = copy.deepcopy(model).requires_grad_(False)
        result = update(policy, reference, rollout, torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=F64), config, optimizer)
        assert result.skipped is None
        results.append((optimizer.total, result.metrics))
    (full_grads, full_metrics), (grads, metrics) = results
    for got, want in zip(grads, full_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    for key in ("loss", "policy", "kl", "ratio_max", "mte_fraction", "selected_fraction"):
        assert metrics[key] == pytest.approx(full_metrics[key], rel=1e-9, abs=1e-12), key
    other = _rollout(model, sampler, seed_selection=lambda seeds: torch.zeros(seeds.shape[1:3], dtype=torch.bool))
    with pytest.raises(ValueError, match="MTE positions"):
        policy = copy.deepcopy(model)
        update(
            policy, None, other, torch.ones(4, dtype=F64), GRPOConfig(kl_beta=0.0, mte=True), SummedGradients(policy.trainable_parameters())
        )


def test_seed_selection_is_refused_where_it_cannot_apply(tiny):
    from margrpo.grpo.selection import mte_tokens

    model, sampler = tiny
    select = mte_tokens(_mte_config())
    with pytest.raises(ValueError, match="likelihood_positions 'revealed'"):
        _rollout(model, sampler, seed_selection=select, likelihood_positions="revealed")
    with pytest.raises(ValueError, match="seed_chains 'commit'"):
        _rollout(model, sampler, seed_selection=select, seed_chains="commit")
    with pytest.raises(ValueError, match=r"seed_selection: returned torch.int64"):
        _rollout(model, sampler, seed_selection=lambda seeds: torch.zeros(seeds.shape[1:3], dtype=torch.long))
    assert mte_tokens(GRPOConfig()) is None and mte_tokens(GRPOConfig(mte=True, mte_random_positions=1)) is None
