"""ops.grpo_surrogate on every backend against a plain PyTorch PPO written here."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, randn

import margrpo.ops as ops

pytestmark = pytest.mark.usefixtures("poison_uninitialized")
MODULE, KERNEL = "grpo_surrogate", "grpo_surrogate_fwd"
F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16


def plain_ppo(logp, old_logp, advantages, mask, clip_low, clip_high, mte_mask, aggregation):
    """The clipped GRPO loss the textbook way, in float64, on [T, B, L] inputs; differentiable in logp.

    Returns ((loss, clip_fraction, approx_kl, ratio_mean, ratio_max), sum of |loss terms|)."""
    T = logp.shape[0]
    # the clamp to +-20 bounds the ratio's value; like the reference contract, the gradient passes
    # through it unchanged (straight through) rather than vanishing for wild tokens
    diff = logp - old_logp
    log_ratio = diff + (diff.clamp(-20.0, 20.0) - diff).detach()
    ratio = log_ratio.exp()
    adv = advantages[None, :, None]
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    term = torch.maximum(unclipped, clipped)
    # each trajectory's share of a token: 1/T on MTE tokens, else all on trajectory 0
    share = torch.zeros(T, *mask.shape, dtype=torch.float64)
    share[0] = 1.0
    share = torch.where(mte_mask, 1.0 / T, share)
    w = mask.double()
    if aggregation == "token_mean":
        token_w = w / w.sum() if w.sum() > 0 else torch.zeros_like(w)
    else:
        per_sample = w.sum(1, keepdim=True)
        kept = per_sample > 0
        token_w = torch.where(kept, w / per_sample.clamp_min(1e-300), 0.0) / max(int(kept.sum()), 1)
    weight = token_w[None] * share
    loss = (weight * term).sum()
    on = weight > 0
    stats = (
        (weight * (clipped > unclipped)).sum(),
        (weight * (ratio - 1 - log_ratio)).sum(),
        (weight * ratio).sum(),
        ratio[on].max() if on.any() else torch.tensor(1.0, dtype=torch.float64),
    )
    return (loss, *stats), float((weight * term).abs().sum())


def check(logp, old_logp, advantages, mask, clip_eps=0.2, clip_eps_high=None, mte_mask=None, aggregation="token_mean"):
    """Loss, statistics and d loss / d logp of the selected backend against plain_ppo."""
    dtype = logp.dtype  # tolerances follow the gradient's dtype, the coarsest output
    out = ops.grpo_surrogate(logp, old_logp, advantages, mask, clip_eps, clip_eps_high, mte_mask, aggregation)
    assert isinstance(out, ops.GRPOLoss)
    out_dtype = F64 if torch.promote_types(dtype, old_logp.dtype) == F64 else F32
    assert out.loss.shape == () and out.stats.shape == (4,) and out.loss.dtype == out.stats.dtype == out_dtype
    assert not out.stats.requires_grad
    named = [getattr(out, name) for name in ops.STATISTICS]
    assert all(v.shape == () for v in named) and torch.equal(torch.stack(named), out.stats)

    ref_logp = logp.detach().cpu().double().requires_grad_()
    three_d = lambda t: t if t.ndim == 3 else t[None]  # noqa: E731
    mte = torch.zeros(mask.shape, dtype=torch.bool) if mte_mask is None else mte_mask.cpu()
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ref, magnitude = plain_ppo(
        three_d(ref_logp), three_d(old_logp.cpu().double()), advantages.cpu().double(), mask.cpu(), clip_eps, high, mte, aggregation
    )
    # the loss sums terms of both signs: its rounding error scales with their magnitude
    assert_close(out.loss, ref[0], dtype, scale=max(1.0, magnitude))
    for got, want in zip(named, ref[1:]):
        assert_close(got, want, dtype)
    out.loss.backward()
    ref[0].backward()
    assert logp.grad.shape == logp.shape and logp.grad.dtype == dtype
    assert_close(logp.grad, ref_logp.grad, dtype)
    return out


def inputs(gen, T, B, L, dtype, device, spread=0.5):
    """Random log-probs whose ratios (spread in log space) fall on both sides of the clip range,
    advantages of both signs."""
    shape = (B, L) if T is None else (T, B, L)
    old = randn(gen, *shape, dtype=dtype, device=device, scale=3.0, shift=-5.0)
    logp = (old.double() + randn(gen, *shape, device=device, scale=spread)).to(dtype).requires_grad_()
    advantages = randn(gen, B, dtype=dtype, device=device)
    return logp, old, advantages


# (T or None for 2-D input, B, L, dtype, float mask?, with mte?, aggregation, clip_eps, clip_eps_high)
CASES = [
    (None, 1, 1, F64, False, False, "token_mean", 0.2, None),
    (None, 3, 7, F32, False, False, "sample_mean", 0.2, None),
    (3, 4, 33, F64, False, True, "token_mean", 0.2, 0.28),
    (5, 2, 17, F32, True, True, "sample_mean", 0.1, None),
    (2, 5, 16, BF16, False, True, "token_mean", 0.2, None),
    (3, 3, 9, F16, True, False, "sample_mean", 0.3, 0.4),
    (1, 4, 8, F32, False, True, "token_mean", 0.2, None),
]


@pytest.mark.parametrize("T, B, L, dtype, float_mask, with_mte, aggregation, clip_eps, clip_eps_high", CASES)
def test_matches_plain_ppo(backend, gen, T, B, L, dtype, float_mask, with_mte, aggregation, clip_eps, clip_eps_high):
    backend.require(MODULE, KERNEL)
    dev = backend.device
    logp, old, advantages = inputs(gen, T, B, L, dtype, dev)
    keep = torch.rand(B, L, generator=gen) > 0.3
    mask = (keep * torch.rand(B, L, generator=gen) * 2).to(dev) if float_mask else keep.to(dev)
    mte = (torch.rand(B, L, generator=gen) > 0.5).to(dev) if with_mte else None
    check(logp, old, advantages, mask, clip_eps, clip_eps_high, mte, aggregation)


def test_non_contiguous_and_mixed_dtype_inputs(backend, gen):
    backend.require(MODULE, KERNEL)
    dev, T, B, L = backend.device, 3, 4, 6
    logp = randn(gen, T, L, B, dtype=F32, device=dev).transpose(1, 2).detach().requires_grad_()  # [T, B, L] view
    old = logp.detach().double() + randn(gen, T, B, L, device=dev, scale=0.3)  # float64 beside float32
    advantages = randn(gen, 2 * B, device=dev)[::2]
    mask = (torch.rand(L, B, generator=gen) > 0.3).to(dev).t()
    mte = (torch.rand(L, B, generator=gen) > 0.5).to(dev).t()
    assert not any(t.is_contiguous() for t in (logp, advantages, mask, mte))
    check(logp, old, advantages, mask, mte_mask=mte)


def test_clipping_branches(backend):
    """One sample per advantage sign; tokens inside and outside the clip range on both sides."""
    backend.require(MODULE, KERNEL)
    ratios = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5], dtype=F64)
    old = torch.zeros(2, 5, dtype=F64, device=backend.device)
    logp = ratios.log().expand(2, 5).clone().to(backend.device).requires_grad_()
    advantages = torch.tensor([2.0, -2.0], dtype=F64, device=backend.device)
    out = check(logp, old, advantages, torch.ones(2, 5, dtype=torch.bool, device=backend.device))
    # A > 0: r = 1.5 is clipped (zero gradient); A < 0: r = 0.5 is clipped; the rest -A r w
    w = 1.0 / 10
    expected = torch.tensor([[-2 * 0.5, -2 * 0.9, -2 * 1.0, -2 * 1.1, 0.0], [0.0, 2 * 0.9, 2 * 1.0, 2 * 1.1, 2 * 1.5]], dtype=F64) * w
    assert_close(logp.grad, expected, F64)
    assert_close(out.clip_fraction, torch.tensor(0.2, dtype=F64), F64)
    assert_close(out.ratio_max, torch.tensor(1.5, dtype=F64), F64)


@pytest.mark.parametrize("T", [None, 3])
@pytest.mark.parametrize("aggregation", ["token_mean", "sample_mean"])
def test_on_policy(backend, gen, T, aggregation):
    """old = logp.detach(): ratio 1, nothing clipped, kl 0, and the gradient is -A w."""
    backend.require(MODULE, KERNEL)
    dev, B, L = backend.device, 3, 6
    logp, _, advantages = inputs(gen, T, B, L, F64, dev)
    mask = torch.ones(B, L, dtype=torch.bool, device=dev)
    mask[1, 2:] = False
    out = ops.grpo_surrogate(logp, logp.detach(), advantages, mask, aggregation=aggregation)
    out.loss.backward()
    m = mask.double()
    w = m / m.sum() if aggregation == "token_mean" else m / m.sum(1, keepdim=True) / B
    expected = -advantages[:, None] * w
    if T is not None:  # no MTE: only trajectory 0 carries weight
        expected = torch.cat([expected[None], torch.zeros(T - 1, B, L, dtype=F64, device=dev)])
    assert_close(logp.grad, expected, F64)
    assert_close(out.loss, (-advantages[:, None] * w).sum(), F64)
    assert out.clip_fraction.item() == 0.0 and abs(out.approx_kl.item()) < 1e-12
    assert_close(out.ratio_mean, torch.tensor(1.0, dtype=F64), F64)
    assert out.ratio_max.item() == 1.0


def test_mte_averages_trajectories(backend, gen):
    """On MTE tokens each of the T trajectories carries 1/T of the token's weight; elsewhere only
    trajectory 0 counts (zero gradient on the others)."""
    backend.require(MODULE, KERNEL)
    dev, T, B, L = backend.device, 3, 2, 5
    logp, old, advantages = inputs(gen, T, B, L, F64, dev, spread=0.02)  # inside the clip range
    mte = torch.tensor([[True, False, True, False, False], [False, True, True, True, False]], device=dev)
    out = check(logp, old, advantages, torch.ones(B, L, dtype=torch.bool, device=dev), mte_mask=mte)
    assert out.clip_fraction.item() == 0.0
    assert torch.all(logp.grad[1:][:, ~mte] == 0) and torch.all(logp.grad[:, mte] != 0)
    # on an MTE token the loss is the mean over trajectories of -A r / (B L)
    ratio = (logp - old).exp().detach()
    per_token = torch.where(mte, ratio.mean(0), ratio[0]) * -advantages[:, None] / (B * L)
    assert_close(out.loss, per_token.sum(), F64)


def test_sample_mean_skips_samples_without_tokens(backend, gen):
    backend.require(MODULE, KERNEL)
    dev = backend.device
    logp, old, advantages = inputs(gen, None, 3, 4, F64, dev)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool, device=dev)
    out = check(logp, old, advantages, mask, aggregation="sample_mean")
    assert torch.all(logp.grad[1] == 0)
    terms = torch.maximum(-advantages[:, None] * (logp - old).exp(), -advantages[:, None] * (logp - old).exp().clamp(0.8, 1.2))
    assert_close(out.loss, (terms[0, :2].mean() + terms[2].mean()) / 2, F64)


def test_nothing_kept(backend, gen):
    backend.require(MODULE, KERNEL)
    logp, old, advantages = inputs(gen, 2, 3, 4, F32, backend.device)
    out = check(logp, old, advantages, torch.zeros(3, 4, dtype=torch.bool, device=backend.device))
    assert out.loss.item() == 0.0 and out.ratio_max.item() == 1.0 and torch.all(logp.grad == 0)


def test_extreme_log_ratios_stay_finite(backend, gen):
    """Log-ratios of +-50 are clamped to +-20 before exp: no inf or NaN in loss, stats or gradient."""
    backend.require(MODULE, KERNEL)
    dev = backend.device
    old = torch.zeros(2, 3, dtype=F32, device=dev)
    logp = torch.tensor([[50.0, -50.0, 0.0], [50.0, -50.0, 0.0]], device=dev).requires_grad_()
    advantages = torch.tensor([1.0, -1.0], device=dev)
    out = check(logp, old, advantages, torch.ones(2, 3, dtype=torch.bool, device=dev), clip_eps=float("inf"))
    assert torch.isfinite(out.loss) and torch.isfinite(out.stats).all() and torch.isfinite(logp.grad).all()


def test_nan_log_probs_show_in_ratio_max(backend, gen):
    """A NaN log-prob on a kept token makes ratio_max NaN, as torch.max in the reference: all NaN,
    one NaN amid a row (vector lanes) or in the last rows (another chunk of the CPU reduction). A NaN
    on a token that is not kept leaves it alone."""
    backend.require(MODULE, KERNEL)
    B, L = 4, 4096  # 16384 terms: more than one chunk (8192 terms) of the CPU kernel
    logp, old, advantages = inputs(gen, None, B, L, F32, backend.device)
    keep = torch.ones(B, L, dtype=torch.bool, device=backend.device)
    logp = logp.detach()
    all_nan = torch.full_like(logp, float("nan"))
    assert ops.grpo_surrogate(all_nan, old, advantages, keep).ratio_max.isnan()
    for b, token in [(0, 1000), (B - 1, 7), (B - 1, L - 1)]:
        one_nan = logp.clone()
        one_nan[b, token] = float("nan")
        assert ops.grpo_surrogate(one_nan, old, advantages, keep).ratio_max.isnan(), (b, token)
        dropped = keep.clone()
        dropped[b, token] = False
        out = ops.grpo_surrogate(one_nan, old, advantages, dropped)
        expected = (logp - old).exp()[dropped].max()
        assert_close(out.ratio_max, expected, F32)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 4)])
def test_empty_batch(backend, shape):
    logp = torch.zeros(shape, device=backend.device, requires_grad=True)
    B, L = shape[-2:]
    keep = torch.ones(B, L, dtype=torch.bool, device=backend.device)
    out = ops.grpo_surrogate(logp, logp.detach(), torch.zeros(B, device=backend.device), keep)
    assert out.loss.item() == 0.0 and out.ratio_max.item() == 1.0
    out.loss.backward()
    assert logp.grad.shape == shape


@pytest.mark.parametrize("aggregation", ["token_mean", "sample_mean"])
def test_gradcheck_torch_backend(gen, aggregation):
    logp, old, advantages = inputs(gen, 3, 3, 5, F64, "cpu")
    mask = torch.rand(3, 5, generator=gen, dtype=F64)
    mte = torch.rand(3, 5, generator=gen) > 0.5
    with ops.use_backend("torch"):
        fn = lambda lp: ops.grpo_surrogate(lp, old, advantages, mask, 0.2, 0.3, mte, aggregation).loss  # noqa: E731
        assert torch.autograd.gradcheck(fn, (logp,))


def test_opcheck(backend, gen):
    backend.require(MODULE, KERNEL)
    logp, old, advantages = inputs(gen, 2, 3, 4, F32, backend.device)
    weights = torch.rand(3, 4, generator=gen).to(backend.device)
    mte = (torch.rand(3, 4, generator=gen) > 0.5).to(backend.device)
    args = (logp, old, advantages, weights / weights.sum(), mte, 0.2, 0.28, backend.name)
    torch.library.opcheck(torch.ops.margrpo.grpo_surrogate.default, args)


def _good():
    return dict(
        logp=torch.zeros(2, 3, 4), old_logp=torch.zeros(2, 3, 4), advantages=torch.zeros(3), mask=torch.ones(3, 4, dtype=torch.bool)
    )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(logp=torch.zeros(4)), ValueError, r"logp: got shape \(4,\) \(1-d\), expected \[B, L\] or \[T, B, L\]"),
        (dict(logp=torch.zeros(0, 3, 4), old_logp=torch.zeros(0, 3, 4)), ValueError, "logp: got shape .* at least one trajectory"),
        (dict(logp=torch.zeros(2, 3, 4, dtype=torch.int64)), TypeError, "logp: got dtype torch.int64"),
        (dict(old_logp=torch.zeros(3, 4)), ValueError, r"old_logp: got shape \(3, 4\), expected \(2, 3, 4\)"),
        (dict(advantages=torch.zeros(4)), ValueError, r"advantages: got shape \(4,\), expected \(3,\)"),
        (dict(advantages=torch.zeros(3, dtype=torch.int64)), TypeError, "advantages: got dtype"),
        (dict(mask=torch.ones(3, 5, dtype=torch.bool)), ValueError, r"mask: got shape \(3, 5\), expected \(3, 4\)"),
        (dict(mask=torch.ones(3, 4, dtype=torch.int64)), TypeError, "mask: got dtype torch.int64"),
        (dict(mask=[[1.0]]), TypeError, "mask: got list"),
        (dict(mte_mask=torch.ones(3, 4)), TypeError, "mte_mask: got torch.float32, expected a bool"),
        (dict(mte_mask=torch.ones(3, 3, dtype=torch.bool)), ValueError, r"mte_mask: got shape \(3, 3\)"),
        (dict(aggregation="mean"), ValueError, "aggregation: got 'mean', expected one of 'token_mean', 'sample_mean'"),
        (dict(clip_eps=-0.1), ValueError, "clip_eps: got -0.1"),
        (dict(clip_eps_high=-1.0), ValueError, "clip_eps_high: got -1.0"),
        (dict(clip_eps="0.2"), TypeError, "clip_eps: got str"),
        (dict(advantages=torch.zeros(3, device="meta")), ValueError, "logp, old_logp, advantages, mask, mte_mask: expected one device"),
    ],
)
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        ops.grpo_surrogate(**(_good() | kwargs))


def test_a_nan_advantage_is_an_error_on_cpu(gen):
    """Eager calls on CPU tensors check the advantages (free there): a NaN one is named, not a NaN loss."""
    logp, old, advantages = inputs(gen, None, 3, 5, F32, "cpu")
    advantages = advantages.clone()
    advantages[1] = float("nan")
    with pytest.raises(ValueError, match="advantages: got 1 non-finite values of 3"):
        ops.grpo_surrogate(logp, old, advantages, torch.ones(3, 5, dtype=torch.bool))
    # a caller that checked them already skips the check: the NaN reaches the loss instead
    out = ops.grpo_surrogate(logp, old, advantages, torch.ones(3, 5, dtype=torch.bool), check_finite=False)
    assert torch.isnan(out.loss)


def test_a_call_without_mte_mask_equals_an_all_false_one(gen):
    """Eager calls without an mte_mask share one all-False mask per shape: repeated calls (the second
    reads the kept one) equal an explicit all-False mask."""
    logp, old, advantages = inputs(gen, 3, 4, 6, F32, "cpu")
    mask = torch.rand(4, 6, generator=gen) < 0.7
    explicit = ops.grpo_surrogate(logp, old, advantages, mask, mte_mask=torch.zeros(4, 6, dtype=torch.bool))
    for _ in range(2):
        implicit = ops.grpo_surrogate(logp, old, advantages, mask)
        assert torch.equal(implicit.loss, explicit.loss) and torch.equal(implicit.stats, explicit.stats)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_operands_passed_as_they_are_equal_the_normalised_call(gen, dtype):
    """The trainer's form (3-D logp, float weights, aggregation "sum", everything contiguous in the
    compute dtype) goes to the kernel as it is; a non-contiguous copy, constants that record autograd
    and a missing mte_mask take the normalising path: the same loss, statistics and logp gradient, bit
    for bit, and no gradient reaches the constants."""
    logp, old, advantages = inputs(gen, 3, 4, 10, dtype, "cpu")
    weights = ops.token_weights(torch.rand(4, 10, generator=gen) < 0.7, dtype=dtype)
    mte = torch.rand(4, 10, generator=gen) < 0.3

    def call(logp, old, advantages, weights, mte):
        out = ops.grpo_surrogate(logp, old, advantages, weights, mte_mask=mte, aggregation="sum")
        (grad,) = torch.autograd.grad(out.loss, logp)
        return out.loss.detach(), out.stats, grad

    def strided(t):  # the same values, every other element of a wider tensor
        wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t.detach()
        return wide[..., ::2]

    for _ in range(2):  # the second call reads the remembered plan
        want = call(logp, old, advantages, weights, mte)
        logp_strided = strided(logp).requires_grad_()
        tracked = [t.clone().requires_grad_() for t in (old, advantages, weights)]
        variants = [
            call(logp_strided, strided(old), strided(advantages), strided(weights), strided(mte)),
            call(logp, *tracked, mte),
        ]
        for got in variants:
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert all(t.grad is None for t in tracked)
    no_mte = call(logp, old, advantages, weights, None)
    with_zeros = call(logp, old, advantages, weights, torch.zeros_like(mte))
    assert all(torch.equal(a, b) for a, b in zip(no_mte, with_zeros))
