"""Advantages and KL penalties against direct formulas on fresh random inputs."""

import pytest
import torch

from margrpo.grpo import advantages as adv
from margrpo.grpo import kl


def test_group_advantages_match_formula():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=g, dtype=torch.float64)
    out = adv.group_advantages(rewards, group_size=4, mode="group", eps=1e-4)
    for grp in range(3):
        r = rewards[grp * 4 : (grp + 1) * 4]
        expected = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
        torch.testing.assert_close(out[grp * 4 : (grp + 1) * 4], expected)
    no_std = adv.group_advantages(rewards, 4, mode="no_std")
    torch.testing.assert_close(no_std.view(3, 4).sum(1), torch.zeros(3, dtype=torch.float64), atol=1e-12, rtol=0)
    batch = adv.group_advantages(rewards, 4, mode="batch_std", eps=0.0)
    torch.testing.assert_close(batch, no_std / rewards.std(unbiased=False))


def test_identical_rewards_give_zero_advantage_and_are_flagged():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5])
    out = adv.group_advantages(rewards, 3)
    assert torch.equal(out[:3], torch.zeros(3))
    assert adv.zero_variance_groups(rewards, 3).tolist() == [True] * 3 + [False] * 3


@pytest.mark.parametrize("bad", [dict(group_size=5), dict(group_size=0), dict(mode="median")])
def test_advantage_bad_input(bad):
    kwargs = dict(group_size=4, mode="group") | bad
    with pytest.raises(ValueError, match="group_size|mode"):
        adv.group_advantages(torch.rand(8), **kwargs)


def test_prompt_tracker_uses_per_prompt_history_and_round_trips():
    tracker = adv.PromptTracker(buffer_size=4, min_count=2)
    first = tracker(["a", "a", "b"], torch.tensor([1.0, 3.0, 5.0]))
    # "a" has 2 values (mean 2, std 1); "b" has 1 < min_count -> batch stats (mean 3, std sqrt(8/3))
    torch.testing.assert_close(first[:2], torch.tensor([-1.0, 1.0]), atol=1e-3, rtol=0)
    torch.testing.assert_close(first[2], torch.tensor((5 - 3) / (8 / 3) ** 0.5), atol=1e-3, rtol=0)
    clone = adv.PromptTracker()
    clone.load_state_dict(tracker.state_dict())
    assert dict(clone.history) == dict(tracker.history) and clone.buffer_size == 4


def test_gaussian_kl_matches_distribution_kl():
    g = torch.Generator().manual_seed(1)
    mean, ref = torch.randn(2, 5, 16, generator=g, dtype=torch.float64).unbind(0)
    std = torch.rand(5, 1, generator=g, dtype=torch.float64) + 0.1
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean, std.expand_as(mean)), torch.distributions.Normal(ref, std.expand_as(ref))
    ).sum(-1)
    torch.testing.assert_close(kl.gaussian_kl(mean, ref, std).double(), expected, rtol=1e-5, atol=1e-6)


def test_k3_is_nonnegative_and_zero_on_policy():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(100, generator=gen, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(100, generator=gen, dtype=torch.float64)
    assert (kl.k3_logp(logp, ref) >= 0).all()
    assert torch.equal(kl.k3_logp(logp, logp), torch.zeros(100))
    # k3 is an unbiased KL estimator: for N(0,1) samples vs ref N(0.5,1), E[k3] = KL = 0.125
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    p = torch.distributions.Normal(0.0, 1.0)
    q = torch.distributions.Normal(0.5, 1.0)
    assert abs(kl.k3_logp(p.log_prob(x), q.log_prob(x)).mean().item() - 0.125) < 0.005


def test_kl_dispatch_and_unknown_kind():
    mean, ref = torch.zeros(3, 4), torch.ones(3, 4)
    # per channel e - 2; summed over the 4 channels by default, averaged with channel_reduction="mean"
    torch.testing.assert_close(kl.kl_penalty("parity_mean_k3", mean=mean, ref_mean=ref), torch.full((3,), 4 * (torch.e - 2)))
    torch.testing.assert_close(
        kl.kl_penalty("parity_mean_k3", mean=mean, ref_mean=ref, channel_reduction="mean"), torch.full((3,), torch.e - 2)
    )
    with pytest.raises(ValueError, match="kl_type"):
        kl.kl_penalty("forward", mean=mean, ref_mean=ref)


def test_k3_keeps_its_precision_near_on_policy():
    """GRPO lives near on-policy, where k3 = e^d - 1 - d ~ d^2 / 2 is tiny: in float32 it must come out
    to a few digits (expm1(d) - d), not as the cancellation noise of exp(d) - 1 - d (~1e-7 absolute)."""
    g = torch.Generator().manual_seed(3)
    logp = (torch.rand(400, generator=g) * 4 - 6).float()  # per-transition log-probs of a few nats
    d = torch.logspace(-3, -2, 400, dtype=torch.float64) * torch.where(torch.rand(400, generator=g) < 0.5, -1, 1)
    ref = (logp.double() + d).float()  # both exact float32 values ...
    exact_d = ref.double() - logp.double()  # ... so their difference is exact
    expected = torch.expm1(exact_d) - exact_d  # float64
    got = kl.k3_logp(logp, ref)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=2e-3, atol=0)
