"""No host synchronisation per mask step or per diffusion step, in the rollout and in the training
likelihood (margrpo.bench.op_counts counts them on CPU: a read of a tensor into Python, a value-sized
output, a tensor filled from host data).

The only syncs left in a rollout are in the recording plan (rollout/plan.py), which draws from a CPU
generator and reads CPU tensors: host work on a GPU machine too. Everything else must not change
with the number of steps, so a step added to the loop cannot add a stall.
"""

from __future__ import annotations

import pytest
import torch

from margrpo.bench.op_counts import count_ops
from margrpo.heads import reinit_zero_layers_
from margrpo.rollout import RolloutConfig, generate, rollout_logprob

HOST_ONLY = ("rollout/plan.py",)  # works on CPU tensors by construction (a CPU torch.Generator)
PROMPTS = ["a red circle", "two blue squares"]


def test_counter_sees_every_kind_of_sync():
    x = torch.randn(5)
    with count_ops() as counts:
        x.sum().item()
        int(x.argmax())
        bool(x[0] > 0)
        x.tolist()
        x.nonzero()
        x[x > 0]
        torch.tensor([1.0, 2.0])
        x.mul(2).add_(1)
    assert counts.syncs == 6, counts.sites
    assert counts.host_to_device == 1
    assert counts.launches >= 2 and counts.ops["aten.mul.Tensor"] == 1
    assert any("tests/" not in site and site.endswith("?") for site in counts.sites)  # outside margrpo


def _tiny():
    from margrpo.models.tiny import TinyMAR, TinyMARConfig

    torch.manual_seed(0)
    model = TinyMAR(TinyMARConfig(patch_size=8, width=32, depth=1, num_heads=2, head_width=32, head_depth=1))
    reinit_zero_layers_(model.head, std=0.02)
    return model.eval(), "harmon"


def _nova(tmp_path):
    from margrpo.models import nova

    return nova.load(nova.save_preset("nova-tiny", tmp_path / "nova", seed=3)).eval(), "nova"


def _harmon():
    pytest.importorskip("transformers")
    from margrpo.models import harmon

    return harmon.build("harmon-tiny", seed=1).eval(), "harmon"


@pytest.fixture(params=["tiny", "nova", "harmon"])
def backbone(request, tmp_path):
    if request.param == "tiny":
        return _tiny()
    return _nova(tmp_path) if request.param == "nova" else _harmon()


def _counted_rollout(model, schedule: str, mask_steps: int, diffusion_steps: int, **modes):
    config = RolloutConfig(
        num_mask_steps=mask_steps,
        num_diffusion_steps=diffusion_steps,
        schedule=schedule,
        cfg_scale=2.0,
        num_seeds=2,
        record_mask_steps=2,
        record_diffusion_steps=2,
        **modes,
    )
    with count_ops() as rollout_counts:
        rollout = generate(model, PROMPTS, config, [3, 4])
    with count_ops() as likelihood_counts:
        rollout_logprob(model, rollout)
    return rollout_counts, likelihood_counts


def _device_syncs(counts) -> list[str]:
    return [site for site in counts.sites if site.startswith("sync") and not site.split(" @ ")[1].startswith(HOST_ONLY)]


@pytest.mark.parametrize(
    "modes", [{}, {"likelihood_positions": "unknown", "known_mask": "post_step"}], ids=["revealed", "unknown-post-step"]
)
def test_rollout_and_likelihood_do_not_sync_per_step(backbone, modes):
    model, schedule = backbone
    short = _counted_rollout(model, schedule, 4, 4, **modes)
    long = _counted_rollout(model, schedule, 6, 8, **modes)  # 2 more mask steps, 4 more diffusion steps
    for (rollout, likelihood), steps in ((short, "4x4"), (long, "6x8")):
        assert _device_syncs(rollout) == [], f"{steps}: {dict(rollout.sites)}"
        assert likelihood.syncs == 0, f"{steps}: {dict(likelihood.sites)}"
    for name, a, b in (("rollout", *[s[0] for s in (short, long)]), ("likelihood", *[s[1] for s in (short, long)])):
        assert (a.syncs, a.host_to_device) == (b.syncs, b.host_to_device), (
            f"{name}: per-step syncs or host copies: {dict(a.sites)} vs {dict(b.sites)}"
        )
        assert b.launches > a.launches or name == "likelihood"  # the counter did see the longer loop


def test_scoring_the_seeds_at_some_positions_reads_the_host_once_per_call():
    """rollout_logprob(seed_positions=...) (the update under MTE) reads how many tokens each recorded
    step scores its seeds on once for all steps together, however many steps are recorded."""
    model, schedule = _tiny()
    syncs = []
    for recorded in (1, 3):
        config = RolloutConfig(num_mask_steps=6, schedule=schedule, num_seeds=2, record_mask_steps=recorded, record_diffusion_steps=2)
        rollout = generate(model, PROMPTS, config, [3, 4])
        selected = torch.rand(rollout.batch_size, rollout.num_transitions, generator=torch.Generator().manual_seed(1)) < 0.5
        with count_ops() as everywhere:
            rollout_logprob(model, rollout)
        with count_ops() as some:
            rollout_logprob(model, rollout, seed_positions=selected)
        syncs.append((some.syncs - everywhere.syncs, some.host_to_device - everywhere.host_to_device))
    assert syncs == [(1, 0), (1, 0)], syncs


def test_deferred_seed_chains_read_the_host_once_per_rollout():
    """generate(seed_selection=...) (the trainer under MTE) reads how many selected tokens each
    recorded step has once, for all of them together, however many steps are recorded."""
    from margrpo.grpo import GRPOConfig
    from margrpo.grpo.selection import mte_tokens

    model, schedule = _tiny()
    select = mte_tokens(GRPOConfig(mte=True, mte_ratio=0.3))
    extra = []
    for recorded in (1, 3):
        config = RolloutConfig(
            num_mask_steps=6,
            schedule=schedule,
            num_seeds=2,
            record_mask_steps=recorded,
            record_diffusion_steps=2,
            likelihood_positions="unknown",
        )
        with count_ops() as everywhere:
            generate(model, PROMPTS, config, [3, 4])
        with count_ops() as deferred:
            generate(model, PROMPTS, config, [3, 4], seed_selection=select)
        syncs = [sum(counts.sites[site] for site in _device_syncs(counts)) for counts in (deferred, everywhere)]
        extra.append((syncs[0] - syncs[1], deferred.host_to_device - everywhere.host_to_device))
    assert extra == [(1, 0), (1, 0)], extra


@pytest.mark.parametrize("parity", [False, True], ids=["default", "parity-options"])
def test_the_loss_and_its_backward_do_not_sync(parity):
    """margrpo.grpo's loss of a chunk (token weights normalised beforehand, once): no host read in
    the forward or the backward, with the clipped ratio, MTE, the KL and, for the parity options, the
    seeds-only MTE split, per-pixel positions and the element mean."""
    from margrpo import ops
    from margrpo.grpo.objective import chunk_loss, position_logp

    gen = torch.Generator().manual_seed(0)
    T, B, L, C, P = 3, 4, 10, 16, (4 if parity else 1)
    x_prev, std = torch.randn(T, B, L, C, generator=gen), 0.5 + torch.rand(T, B, L, C, generator=gen)
    mean = (x_prev + 0.1 * torch.randn(T, B, L, C, generator=gen)).requires_grad_()
    ref_mean = mean.detach() + 0.05 * torch.randn(T, B, L, C, generator=gen)
    old = position_logp(x_prev, mean.detach() + 0.01, std, P)
    keep = torch.rand(B, L * P, generator=gen) > 0.3
    weights, kl_weights = ops.token_weights(keep), ops.token_weights(torch.ones(B, L, dtype=torch.bool))
    mte = torch.rand(B, L * P, generator=gen) > 0.5
    with count_ops() as counts:
        out = chunk_loss(
            position_logp(x_prev, mean, std, P),
            old,
            torch.randn(B, generator=gen),
            weights,
            mte_mask=mte,
            clip_eps=0.2,
            clip_eps_high=0.28,
            kl_beta=0.1,
            kl_type="parity_mean_k3" if parity else "gaussian",
            kl_weights=kl_weights,
            mean=mean,
            ref_mean=ref_mean,
            std=std,
            mte_include_rollout=not parity,
            channel_reduction="mean" if parity else "sum",
            pixels_per_token=P,
        )
        out.loss.backward()
    assert counts.syncs == 0 and counts.host_to_device == 0, dict(counts.sites)
    assert counts.launches > 10 and mean.grad.abs().sum() > 0  # the counter saw the loss and its gradient
