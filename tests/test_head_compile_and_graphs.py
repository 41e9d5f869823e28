"""The fused multi-seed loop compiles end to end (no graph break, the same numbers), and the
`rollout.cuda_graph` key: validated at load, an error naming it off CUDA, the captured chain equal to
the uncaptured one on a GPU (issue 26, item 3)."""

from __future__ import annotations

import pytest
import torch

from margrpo.config import ConfigError
from margrpo.diffusion import DDPMSampler, FlowSDESampler, mar_sampler
from margrpo.heads import Guidance, multi_seed_denoise
from margrpo.heads.mar_head import SimpleMLPAdaLN
from margrpo.heads.nova_head import DiffusionMLP
from margrpo.rollout import RolloutConfig
from margrpo.train.config import load_config

C, DZ, K, T, N = 4, 24, 2, 5, 6


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _frozen(head):
    for p in head.parameters():
        p.requires_grad_(False)
    return head.eval()


def _cases():
    torch.manual_seed(0)
    mar = _frozen(SimpleMLPAdaLN(C, 32, 2 * C, DZ, 2))
    nova = _frozen(DiffusionMLP(2, 32, DZ, 1, C))  # patch 1 x image_dim C: C-channel tokens
    return {
        "mar-ddpm-learned": (mar, mar_sampler(T), Guidance(3.0, channels="eps")),
        "nova-ddpm-cosine": (nova, DDPMSampler(T, beta_schedule="squaredcos_cap_v2", spacing="trailing"), Guidance(5.0)),
        "nova-flow-nocfg": (nova, FlowSDESampler(T), None),
    }


def _inputs(head, cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn((2 if cfg is not None else 1) * N, head.z_channels, generator=g)
    noise = torch.randn(T + 1, K + 1, N, head.in_channels, generator=g)
    return z, noise


# one case in the CI selection (tracing takes ~10 s on a 2-core machine), the others marked slow
@pytest.mark.parametrize(
    "name",
    ["nova-ddpm-cosine", pytest.param("mar-ddpm-learned", marks=pytest.mark.slow), pytest.param("nova-flow-nocfg", marks=pytest.mark.slow)],
)
def test_fused_loop_has_no_graph_break(name):
    head, sampler, cfg = _cases()[name]
    z, noise = _inputs(head, cfg)
    torch._dynamo.reset()
    with torch.no_grad():
        found = torch._dynamo.explain(lambda z, n: multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=n, record_steps=(1, 3)).x0)(
            z, noise
        )
    torch._dynamo.reset()
    assert found.graph_break_count == 0, [str(b.reason).splitlines()[0] for b in found.break_reasons]
    assert found.graph_count == 1


def test_fullgraph_compile_equals_eager():
    head, sampler, cfg = _cases()["mar-ddpm-learned"]
    z, noise = _inputs(head, cfg, seed=1)

    def run(z, noise):
        out = multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, record_steps=(0, 2))
        return out.x0, out.logp, out.mean

    torch._dynamo.reset()
    compiled = torch.compile(run, backend="eager", fullgraph=True)  # the traced graph, run eagerly: fast
    with torch.no_grad():
        want, got = run(z, noise), compiled(z, noise)
        again = compiled(*_inputs(head, cfg, seed=2))  # new values, same shapes: no retrace
    torch._dynamo.reset()
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again[0], run(*_inputs(head, cfg, seed=2))[0], rtol=1e-5, atol=1e-5)


def test_sampler_steps_read_python_numbers_equal_to_the_tables():
    # the step functions read the per-step coefficients as Python floats (compile-friendly); they must
    # be the very values of the float64 tables
    for sampler in (mar_sampler(T), DDPMSampler(T, beta_schedule="squaredcos_cap_v2", spacing="trailing"), FlowSDESampler(T)):
        tables = {name: getattr(sampler, f"_{name}") for name in sampler._host if name not in ("deterministic", "sigma")}
        for name, values in tables.items():
            assert sampler._host[name] == tuple(float(v) for v in values), name
        assert sampler._host["deterministic"] == tuple(bool(v) for v in sampler._deterministic)


# ---------------------------------------------------------------------- rollout.cuda_graph
def test_cuda_graph_key_defaults_off_and_rejects_non_booleans():
    assert RolloutConfig().cuda_graph is False and load_config(None, []).rollout.cuda_graph is False
    with pytest.raises(ConfigError, match=r"^cuda_graph: got 'yes'"):
        RolloutConfig(cuda_graph="yes")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.cuda_graph=maybe"])
    assert str(err.value).startswith("rollout.cuda_graph"), str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is absent")
def test_cuda_graph_true_without_cuda_is_an_error_naming_the_key():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.cuda_graph=true"])
    message = str(err.value)
    assert message.startswith("rollout.cuda_graph: got True, expected false, or true on a machine with CUDA"), message


def test_graphed_denoise_off_cuda_names_the_key():
    head, sampler, cfg = _cases()["mar-ddpm-learned"]
    z, noise = _inputs(head, cfg)
    with pytest.raises(ValueError, match=r"^rollout\.cuda_graph: got true with the rollout on cpu, expected a CUDA device"):
        multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, cuda_graph=True)
    with pytest.raises(ValueError, match=r"^rollout\.cuda_graph"):  # a recorded call is checked as well
        multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, record_steps=(1,), cuda_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_rollout_chains_equal_uncaptured_and_replay():
    from margrpo.heads import cuda_graph

    head, sampler, cfg = _cases()["mar-ddpm-learned"]
    head = head.cuda()
    for seed in (0, 1, 2):  # the first call captures, the later ones replay with new inputs
        z, noise = (t.cuda() for t in _inputs(head, cfg, seed=seed))
        plain = multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise)
        graphed = multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, cuda_graph=True)
        torch.testing.assert_close(graphed.x0, plain.x0, rtol=1e-5, atol=1e-5)
        recorded = multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, record_steps=(1, 3), cuda_graph=True)
        want = multi_seed_denoise(head, z, sampler, K, cfg=cfg, noise=noise, record_steps=(1, 3))
        torch.testing.assert_close(recorded.logp, want.logp, rtol=0, atol=0)  # uncaptured: the same loop
    pool, graphs = cuda_graph._ROLLOUT_GRAPHS[head]
    assert len(graphs) == 1 and len(next(iter(graphs.values()))._graphs) == 1
    z, noise = (t.cuda() for t in _inputs(head, cfg, seed=3))
    other = multi_seed_denoise(head, z[:, :], sampler, K, cfg=Guidance(2.0, channels="eps"), noise=noise, cuda_graph=True)
    torch.testing.assert_close(other.x0, multi_seed_denoise(head, z, sampler, K, cfg=Guidance(2.0, channels="eps"), noise=noise).x0)
    assert len(graphs) == 2  # another guidance scale: another graph, in the same pool
    torch.cuda.synchronize()
