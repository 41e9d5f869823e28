"""Data parallelism on CPU (gloo, torchrun): FSDP2 (fully_shard) trains the same weights as DDP and as one
process over the same seeds, with a frozen head, a trainable head and LoRA adapters; a checkpoint
written under FSDP2 resumes in one process and a DDP one loads into FSDP2; plus the helpers'
single-process behaviour.

One torchrun launch runs every 2-rank configuration (this file is its worker script, see the bottom):
starting processes costs more than the tiny runs themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from margrpo.config import ConfigError
from margrpo.train import checkpoint as ckpt
from margrpo.train import distributed as dist_utils
from margrpo.train.config import load_config
from margrpo.train.trainer import Trainer

STEPS = 2
GRAD_CLIP = 0.02  # below every run's gradient norm: clipping (of DTensor gradients under FSDP2) is active
# name -> overrides; each runs in one process (2P prompts) and on 2 ranks (P prompts each)
SETUPS = {
    "frozen_head": ["grpo.kl_beta=0.01"],  # the paper's setting: blocks + root sharded, head replicated
    "trained_head": ["grpo.head=train", "grpo.kl_beta=0"],  # the head is an FSDP unit of its own
    "lora": ["grpo.lora.rank=4", "grpo.kl_beta=0.1"],  # frozen base + adapters in one unit; KL on the base
}
TWO_RANK_RUNS = [("frozen_head", "ddp"), ("frozen_head", "fsdp2"), ("trained_head", "fsdp2"), ("lora", "fsdp2")]


def overrides(out_dir: Path, checkpoint: Path, prompts_per_step: int, *extra: str) -> list[str]:
    # a built-in reward: the torchrun children do not see rewards registered by test modules
    return [
        f"backbone.checkpoint={checkpoint}",
        f"run.out_dir={out_dir}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.eval_per_category=1",
        "run.eval_samples_per_prompt=1",
        "run.save_every=1",
        "run.keep_last=2",
        f"run.steps={STEPS}",
        "run.threads=1",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "grpo.group_size=4",
        f"grpo.prompts_per_step={prompts_per_step}",
        "rewards={jpeg_incompressibility: 1.0}",
        "optim.lr=1e-3",
        f"optim.grad_clip={GRAD_CLIP}",
        *extra,
    ]


def run_dir(root: Path, setup: str, parallel: str) -> Path:
    return root / f"{setup}-{parallel}"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from conftest import make_tiny_checkpoint  # lazily: this file also runs as the torchrun worker script

    return make_tiny_checkpoint(tmp_path_factory, depth=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_checkpoint) -> Path:
    """Every 2-rank run (one torchrun launch) and every one-process run, 2 steps each."""
    root = tmp_path_factory.mktemp("runs")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, str(root), str(tiny_checkpoint)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:  # the one-process runs meanwhile (the children spend seconds starting up)
        for setup, extra in SETUPS.items():
            Trainer(load_config(None, overrides(run_dir(root, setup, "one"), tiny_checkpoint, 4, *extra))).run()
        out, err = torchrun.communicate(timeout=300)
    finally:
        if torchrun.poll() is None:  # a failure above: stop the launcher (it stops its ranks)
            torchrun.terminate()
            torchrun.wait(timeout=30)
    assert torchrun.returncode == 0, out[-2000:] + err[-4000:]
    return root


def final_weights(root: Path, setup: str, parallel: str) -> dict[str, torch.Tensor]:
    weights, state = ckpt.load(ckpt.latest(run_dir(root, setup, parallel) / "checkpoints"))
    assert state["step"] == STEPS
    return weights


def grad_norms(root: Path, setup: str, parallel: str) -> list[float]:
    """The logged gradient norm (before clipping) of each step."""
    lines = (run_dir(root, setup, parallel) / "metrics.jsonl").read_text().splitlines()
    return [row["grad_norm"] for row in map(json.loads, lines) if row["kind"] == "train"]


def assert_same_update(weights: dict, expected: dict, start: dict) -> None:
    """Same trained weights up to fp32 summation order: Adam turns rounding noise in near-zero
    gradients into steps of up to ~lr, so the update vectors are compared as a whole and each
    element against the largest step (measured here: 1e-4 relative, 0.006 of the largest step;
    a rank that skipped the gradient reduction or started from other weights is off by O(1))."""
    assert weights.keys() == expected.keys()
    update = torch.cat([(expected[k] - start[k]).flatten() for k in expected])
    other = torch.cat([(weights[k] - start[k]).flatten() for k in expected])
    moved = update.abs().max().item()
    assert moved > 0, "training did not move the weights"
    assert (other - update).norm() / update.norm() < 2e-3
    for key in expected:
        torch.testing.assert_close(weights[key], expected[key], rtol=0, atol=0.03 * moved)


def initial_values(trainer: Trainer, names) -> dict[str, torch.Tensor]:
    own = dict(trainer.policy.named_parameters())
    return {name: own[name].detach().clone() for name in names}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_fsdp2_trains_what_one_process_trains(runs, tiny_checkpoint, tmp_path, setup):
    one = final_weights(runs, setup, "one")
    fsdp = final_weights(runs, setup, "fsdp2")
    fresh = Trainer(load_config(None, overrides(tmp_path, tiny_checkpoint, 4, "run.resume=never", *SETUPS[setup])), create_run_dir=False)
    start = initial_values(fresh, one)
    # full (gathered) tensors of exactly the trainable parameters, under their unsharded names
    assert set(one) == {n for n, p in fresh.policy.named_parameters() if p.requires_grad}
    for name, value in fsdp.items():
        assert value.shape == start[name].shape, name
    assert_same_update(fsdp, one, start)
    # the norm of the sharded gradients is the norm of the whole gradient (a per-shard norm is not)
    one_norms = grad_norms(runs, setup, "one")
    assert len(one_norms) == STEPS and min(one_norms) > GRAD_CLIP
    assert grad_norms(runs, setup, "fsdp2") == pytest.approx(one_norms, rel=1e-4)
    if setup == "trained_head":
        assert any(name.startswith("head.") for name in one)
    if setup == "lora":
        assert all(".lora_" in name for name in one)


def test_fsdp2_matches_ddp(runs, tiny_checkpoint, tmp_path):
    ddp = final_weights(runs, "frozen_head", "ddp")
    fsdp = final_weights(runs, "frozen_head", "fsdp2")
    fresh = Trainer(load_config(None, overrides(tmp_path, tiny_checkpoint, 4, "run.resume=never")), create_run_dir=False)
    assert_same_update(fsdp, ddp, initial_values(fresh, ddp))
    assert grad_norms(runs, "frozen_head", "fsdp2") == pytest.approx(grad_norms(runs, "frozen_head", "ddp"), rel=1e-4)


def test_batch_metrics_cover_every_rank(runs):
    """reward_std and the advantage statistics of a 2-rank run are those of the whole batch, as one
    process over the same samples logs them (not rank 0's half)."""

    def train_records(parallel):
        lines = (run_dir(runs, "frozen_head", parallel) / "metrics.jsonl").read_text().splitlines()
        return [row for row in map(json.loads, lines) if row["kind"] == "train"]

    one, ddp = train_records("one"), train_records("ddp")
    assert len(one) == len(ddp) == STEPS
    for a, b in zip(one, ddp):
        for key in ("reward_mean", "reward_std", "advantage_abs_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4), key
        assert b["advantage_mean"] == pytest.approx(a["advantage_mean"], abs=1e-6)


@pytest.mark.parametrize("setup", ["frozen_head", "lora"])
def test_fsdp2_checkpoint_resumes_in_one_process(runs, tiny_checkpoint, tmp_path, setup):
    """Step 1 of the FSDP2 run, resumed in one process for step 2, lands on the FSDP2 run's step 2:
    weights and the name-keyed Adam state were gathered whole and load into an unsharded model."""
    fsdp_root = run_dir(runs, setup, "fsdp2") / "checkpoints"
    first, last = ckpt.list_checkpoints(fsdp_root)
    weights, state = ckpt.load(first)
    assert all(isinstance(name, str) for group in state["optimizer"]["param_groups"] for name in group["params"])
    resumed = Trainer(load_config(None, overrides(tmp_path, tiny_checkpoint, 4, "run.resume=never", *SETUPS[setup])), create_run_dir=False)
    resumed.load_checkpoint(first)
    assert resumed.step == 1
    own = dict(resumed.policy.named_parameters())
    for name, value in weights.items():
        assert torch.equal(own[name].detach(), value), name
    moments = {id(p): s for p, s in resumed.optimizer.state.items()}
    assert any(torch.count_nonzero(moments[id(own[n])]["exp_avg_sq"]) > 0 for n in weights)
    resumed.train_step()
    expected, _ = ckpt.load(last)
    assert_same_update(dist_utils.full_state_dict(resumed.policy), expected, weights)


# ---------------------------------------------------------------------- single process
def test_helpers_are_no_ops_in_one_process(tiny_checkpoint, tmp_path):
    trainer = Trainer(
        load_config(None, overrides(tmp_path, tiny_checkpoint, 2, "run.parallel=fsdp2", "run.resume=never")), create_run_dir=False
    )
    assert not trainer.sharded and not dist_utils.is_sharded(trainer.policy)  # one process: plain model
    assert dist_utils.all_ranks(True) and not dist_utils.all_ranks(False)
    with pytest.raises(RuntimeError, match="run.parallel: fsdp2 needs"):
        dist_utils.shard_fsdp2(trainer.policy, torch.device("cpu"))
    blocks = dist_utils.transformer_blocks(trainer.policy, exclude=[trainer.policy.head])
    assert [id(b) for b in blocks] == [id(b) for b in trainer.policy.blocks]


def test_optimizer_state_by_name_round_trip(tiny_checkpoint, tmp_path):
    """An optimizer state numbered by position (DDP / one-process checkpoints) converts to the
    name-keyed layout FSDP2 checkpoints use, and loads back to the same state."""
    trainer = Trainer(
        load_config(None, overrides(tmp_path, tiny_checkpoint, 2, "run.resume=never", "grpo.head=train")), create_run_dir=False
    )
    params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, 0.1 * (i + 1))
    trainer.optimizer.step()
    by_position = trainer.optimizer.state_dict()
    by_name = dist_utils._state_by_name(trainer.policy, trainer.optimizer, by_position)
    names = {id(p): n for n, p in trainer.policy.named_parameters()}
    assert [g["params"] for g in by_name["param_groups"]] == [[names[id(p)] for p in g["params"]] for g in trainer.optimizer.param_groups]
    other = Trainer(load_config(None, overrides(tmp_path, tiny_checkpoint, 2, "run.resume=never", "grpo.head=train")), create_run_dir=False)
    dist_utils.load_optimizer_state(other.policy, other.optimizer, by_name)
    loaded = other.optimizer.state_dict()

    def plain(groups):  # the name-keyed layout stores betas as a list
        return [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in groups]

    assert plain(loaded["param_groups"]) == plain(by_position["param_groups"])
    for index, value in by_position["state"].items():
        for key, tensor in value.items():
            assert torch.equal(loaded["state"][index][key], tensor), (index, key)


def test_config_keys(tiny_checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="run.parallel.*'ddp', 'fsdp2'"):
        load_config(None, overrides(tmp_path, tiny_checkpoint, 2, "run.parallel=fsdp"))
    with pytest.raises(ConfigError, match="grpo.lora.rank.*grpo.head: frozen"):
        load_config(None, overrides(tmp_path, tiny_checkpoint, 2, "grpo.lora.rank=4", "grpo.head=train"))


# ---------------------------------------------------------------------- torchrun worker
def _worker(root: str, checkpoint: str) -> None:
    """Under torchrun: every 2-rank run of TWO_RANK_RUNS, one after the other in one process group."""
    for setup, parallel in TWO_RANK_RUNS:
        extra = [*SETUPS[setup], f"run.parallel={parallel}"]
        trainer = Trainer(load_config(None, overrides(run_dir(Path(root), setup, parallel), Path(checkpoint), 2, *extra)))
        assert trainer.sharded == (parallel == "fsdp2")
        trainer.run()
        if trainer.is_main:
            print(json.dumps({"setup": setup, "parallel": parallel, "step": trainer.step}))
    _check_ddp_checkpoint_loads_sharded(Path(root), Path(checkpoint))
    dist_utils.shutdown()


def _check_ddp_checkpoint_loads_sharded(root: Path, checkpoint: Path) -> None:
    """A DDP checkpoint (optimizer state numbered by position) loads into an FSDP2 trainer: gathering
    the loaded weights and Adam state back gives exactly the checkpoint's."""
    weights, state = ckpt.load(ckpt.latest(run_dir(root, "frozen_head", "ddp") / "checkpoints"))
    trainer = Trainer(
        load_config(None, overrides(root / "load-check", checkpoint, 2, *SETUPS["frozen_head"], "run.parallel=fsdp2", "run.resume=never")),
        create_run_dir=False,
    )
    trainer.load_checkpoint(ckpt.latest(run_dir(root, "frozen_head", "ddp") / "checkpoints"))
    gathered = trainer.trainable_state()
    optimizer = dist_utils.full_optimizer_state(trainer.policy, trainer.optimizer)
    if trainer.is_main:
        assert gathered.keys() == weights.keys()
        assert all(torch.equal(gathered[k], weights[k]) for k in weights)
        expected = dist_utils._state_by_name(trainer.policy, trainer.optimizer, state["optimizer"])
        assert optimizer["state"].keys() == expected["state"].keys()
        for name, values in expected["state"].items():
            assert all(torch.equal(optimizer["state"][name][key].cpu(), value) for key, value in values.items()), name


if __name__ == "__main__":
    _worker(*sys.argv[1:])
