"""rollout.compile_head: each diffusion step's head output as one torch.compile graph (issue 26, item
3). The key resolves per device, the compiled chain equals the uncompiled one, one graph serves every
token count, a rollout compiled equals the rollout uncompiled, and a failed compile warns once and
falls back."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from margrpo.config import ConfigError
from margrpo.diffusion import DDPMSampler
from margrpo.heads import Guidance, compiled, multi_seed_denoise
from margrpo.heads.multi_seed import step_output
from margrpo.heads.nova_head import DiffusionMLP
from margrpo.rollout import RolloutConfig, generate
from margrpo.train.config import load_config

C, DZ, K, T = 4, 24, 2, 3


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _nova_head():
    torch.manual_seed(0)
    head = DiffusionMLP(2, 32, DZ, 1, C)  # patch 1 x image_dim C: C-channel tokens
    return head.requires_grad_(False).eval(), DDPMSampler(T, beta_schedule="squaredcos_cap_v2", spacing="trailing")


# ---------------------------------------------------------------------- the key
def test_compile_head_defaults_to_auto_compiled_on_cuda_only():
    config = RolloutConfig()
    assert config.compile_head == "auto" and load_config(None, []).rollout.compile_head == "auto"
    assert config.compiles_head(torch.device("cuda")) is True
    assert config.compiles_head(torch.device("cpu")) is False
    assert RolloutConfig(compile_head=True).compiles_head(torch.device("cpu")) is True
    assert RolloutConfig(compile_head=False).compiles_head(torch.device("cuda")) is False
    graphed = RolloutConfig()
    graphed.cuda_graph = True  # (a config with CUDA graphs cannot be built on a machine without CUDA)
    assert graphed.compiles_head(torch.device("cuda")) is False  # a captured chain is not compiled


def test_compile_head_rejects_other_values_and_cuda_graphs(monkeypatch):
    with pytest.raises(ConfigError, match=r"^rollout\.compile_head: got 'maybe', expected true or false or 'auto'"):
        load_config(None, ["rollout.compile_head=maybe"])
    with pytest.raises(ConfigError, match=r"^compile_head: got 2"):
        RolloutConfig(compile_head=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # lets cuda_graph pass its own rule
    RolloutConfig(cuda_graph=True)  # auto: not compiled, no error
    with pytest.raises(ConfigError, match=r"^compile_head: got True, .*true needs cuda_graph false"):
        RolloutConfig(cuda_graph=True, compile_head=True)


# ---------------------------------------------------------------------- the chain
def test_compiled_chain_equals_the_uncompiled_one_with_one_graph_for_every_token_count():
    """Inductor for real (a tiny head, 3 steps): x0 and the recorded transitions equal the uncompiled
    chain's, whatever the token count, seed count, guidance scale, image split or the noise's layout,
    from one graph (a single token runs uncompiled rather than compile a graph of its own)."""
    head, sampler = _nova_head()
    g = torch.Generator().manual_seed(1)
    cases = ((6, 2, (), K, 4.0), (9, 3, (1,), K + 1, 2.5), (1, None, (0,), K, 3.0), (16, None, (0, 2), K, 6.0))
    for n, images, record, k, scale in cases:
        z = torch.randn(2 * n, DZ, generator=g)
        noise = torch.randn(n, T + 1, k + 1, C, generator=g).permute(1, 2, 0, 3)  # a view, as a rollout passes it
        kwargs = dict(cfg=Guidance(scale), noise=noise, record_steps=record, images=images)
        want = multi_seed_denoise(head, z, sampler, k, **kwargs)
        got = multi_seed_denoise(head, z, sampler, k, compiled=True, **kwargs)
        for name in ("x0", "x_t", "x_prev", "mean", "logp"):
            expected = getattr(want, name)
            assert getattr(got, name).shape == expected.shape, name
            scale = float(expected.abs().max()) if expected.numel() else 1.0
            torch.testing.assert_close(getattr(got, name), expected, rtol=1e-5, atol=1e-5 * scale)
    assert _graphs() == 1


def test_a_failed_compile_warns_once_and_runs_uncompiled(monkeypatch):
    head, sampler = _nova_head()
    attempts = []

    def failing(*args):
        attempts.append(args)
        raise torch._dynamo.exc.TorchDynamoException("no compiler here\nmore detail")

    monkeypatch.setattr(compiled, "_compiled", lambda: failing)
    monkeypatch.setattr(compiled, "_FAILED", [])
    g = torch.Generator().manual_seed(2)
    z, noise = torch.randn(2 * 5, DZ, generator=g), torch.randn(T + 1, K + 1, 5, C, generator=g)
    want = multi_seed_denoise(head, z, sampler, K, cfg=Guidance(3.0), noise=noise)
    with pytest.warns(UserWarning, match=r"rollout\.compile_head: torch\.compile of the head's step failed \(no compiler here\)"):
        first = multi_seed_denoise(head, z, sampler, K, cfg=Guidance(3.0), noise=noise, compiled=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = multi_seed_denoise(head, z, sampler, K, cfg=Guidance(3.0), noise=noise, compiled=True)
    assert len(attempts) == 1  # the process stopped trying
    torch.testing.assert_close(first.x0, want.x0, rtol=0, atol=0)
    torch.testing.assert_close(again.x0, want.x0, rtol=0, atol=0)


# ---------------------------------------------------------------------- the rollout
@pytest.mark.parametrize("seed_chains", ["step", "commit"])
def test_rollout_with_compile_head_equals_the_uncompiled_rollout(monkeypatch, seed_chains):
    """A NOVA rollout (linear guidance schedule, seed chains, recorded steps, consistency predictions;
    seed chains deferred to selected tokens, or drawn at commit time as the reference code does) with
    the head compiled: every head step of the rollout goes through the compiled graph, the images and
    records equal the uncompiled rollout's, two graphs serve all its calls, and a second rollout of
    other seeds and another batch size builds none."""
    from margrpo.heads import multi_seed
    from margrpo.models.nova.presets import build

    compiled_fn = torch.compile(step_output, fullgraph=True, backend="eager")  # traced, no Inductor build
    steps = {"compiled": 0, "uncompiled": 0}

    def counted_compiled(*args):
        steps["compiled"] += 1
        return compiled_fn(*args)

    def counted_uncompiled(*args):
        steps["uncompiled"] += 1
        return step_output(*args)

    monkeypatch.setattr(compiled, "_compiled", lambda: counted_compiled)
    backbone = build("nova-tiny", seed=3)
    config = RolloutConfig(
        num_mask_steps=6,
        num_diffusion_steps=3,
        schedule="nova",
        cfg_scale=3.0,
        cfg_schedule="linear",
        num_seeds=2,
        record_mask_steps=2,
        record_diffusion_steps=2,
        likelihood_positions="unknown",
        seed_chains=seed_chains,
    )
    # step-drawn seed chains past the committed tokens run for these tokens only (generate's deferral)
    selection = (lambda seeds: seeds[0, ..., 0] > 0) if seed_chains == "step" else None
    prompts = ["a cat", "a dog", "a red car"]
    for count, seeds in ((3, [1, 2, 3]), (2, [7, 8])):
        with monkeypatch.context() as patch:
            patch.setattr(multi_seed, "step_output", counted_uncompiled)
            want = generate(backbone, prompts[:count], dataclasses.replace(config, compile_head=False), seeds, seed_selection=selection)
        before, steps["compiled"] = _graphs(), 0
        got = generate(backbone, prompts[:count], dataclasses.replace(config, compile_head=True), seeds, seed_selection=selection)
        assert steps["compiled"] == steps["uncompiled"] > 0  # every head step of the rollout, compiled
        steps["uncompiled"] = 0
        if count == 3:
            assert _graphs() == 2  # every call with seed chains, and the lone main chain (a count of 1)
        else:
            assert _graphs() == before  # no recompilation for new seeds and batch size
        for name in ("images", "tokens", "x_t", "x_prev", "logp", "pred_clean"):
            expected = getattr(want, name)
            torch.testing.assert_close(getattr(got, name), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()), msg=name)
