"""The GRPO trainer end to end on a tiny random-init MAR (CPU, seconds): on-policy ratio, frozen head,
learning on a toy reward, exact resume, signals, non-finite handling, config errors, torchrun."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_checkpoint

from margrpo.config import ConfigError
from margrpo.models.tiny import TinyMAR
from margrpo.rewards import Reward, register
from margrpo.train import checkpoint as ckpt
from margrpo.train.config import load_config
from margrpo.train.step import TrainingStopped, group_advantages, record_plan, step_prompts
from margrpo.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


@register("test_redness")
class Redness(Reward):
    """Toy reward: how much redder than green/blue an image is (easy to learn, dense signal)."""

    def score(self, images, prompts, metadata):
        return images[:, 0].mean((1, 2)) - 0.5 * images[:, 1:].mean((1, 2, 3))


@register("test_nan")
class AlwaysNaN(Reward):
    def score(self, images, prompts, metadata):
        return torch.full((images.shape[0],), float("nan"))


@register("test_sigterm_on_second_call")
class SigtermOnSecondCall(Reward):
    calls = 0

    def score(self, images, prompts, metadata):
        type(self).calls += 1
        if type(self).calls == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return images.mean((1, 2, 3))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def overrides(tmp_path, checkpoint, *extra):
    return [
        f"backbone.checkpoint={checkpoint}",
        f"run.out_dir={tmp_path / 'run'}",
        "run.tensorboard=false",
        "run.eval_every=0",
        "run.eval_per_category=1",
        "run.eval_samples_per_prompt=1",
        "run.save_every=0",
        "run.threads=1",
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "grpo.group_size=4",
        "grpo.prompts_per_step=2",
        "rewards={test_redness: 1.0}",
        "optim.lr=1e-3",
        *extra,
    ]


def make(tmp_path, checkpoint, *extra) -> Trainer:
    return Trainer(load_config(None, overrides(tmp_path, checkpoint, *extra)))


def test_first_step_is_on_policy_and_head_stays_frozen(tmp_path, tiny_checkpoint):
    trainer = make(
        tmp_path,
        tiny_checkpoint,
        "rollout.num_seeds=2",
        "rollout.likelihood_positions=unknown",
        "grpo.mte=true",
        "grpo.consistency=true",
        "grpo.consistency_start_step=1",
        "grpo.kl_beta=0.1",
    )
    head_before = {k: v.clone() for k, v in trainer.policy.head.state_dict().items()}
    body_before = {k: v.clone() for k, v in trainer.policy.named_parameters() if not k.startswith("head.")}
    metrics = trainer.train_step()
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    # fp32: recomputation sums in another order; a low-noise step amplifies it by |x - mean| / std^2
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=2e-2)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-10)  # policy == reference before the update
    assert 0 < metrics["mte_fraction"] < 1 and 0 < metrics["selected_fraction"] <= 1
    assert metrics["grad_norm"] > 0
    for key, value in trainer.policy.head.state_dict().items():
        assert torch.equal(value, head_before[key]), f"frozen head parameter {key} changed"
    changed = [k for k, v in trainer.policy.named_parameters() if not k.startswith("head.") and not torch.equal(v, body_before[k])]
    assert changed, "no backbone parameter was updated"


def test_second_inner_epoch_is_off_policy(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "grpo.inner_epochs=2", "grpo.kl_beta=0", "optim.lr=1e-2")
    metrics = trainer.train_step()
    assert metrics["updates"] == 2
    # epoch 2 sees ratios != 1 after epoch 1's update: the averaged ratio_max exceeds 1
    assert metrics["ratio_max"] > 1.0


def test_update_raises_the_likelihood_of_above_average_samples(tmp_path, tiny_checkpoint):
    """The first-order promise of a GRPO step: after one small update, sum_i A_i * (logp_new - logp_old)
    over the batch's recorded transitions is positive (better samples became more likely)."""
    from margrpo.rollout import generate, rollout_logprob

    trainer = make(tmp_path, tiny_checkpoint, "optim.lr=1e-4", "grpo.kl_beta=0", "grpo.prompts_per_step=4")
    prompts, seeds, _ = step_prompts(trainer, 0)
    captured = {}
    original = trainer.reward

    def remember(images, prompts_, metadata=None):
        result = original(images, prompts_, metadata)
        captured["rewards"] = result.total
        return result

    trainer.reward = remember
    trainer.policy.eval()
    rollout = generate(trainer.policy, prompts, trainer.config.rollout, seeds, sampler=trainer.sampler, plan=record_plan(trainer, 0))
    trainer.train_step()
    advantages = group_advantages(trainer, captured["rewards"], prompts)
    with torch.no_grad():
        new_logp = rollout_logprob(trainer.policy, rollout).logp[0]
    change = (new_logp - rollout.logp[0]).mean(1)  # per sample
    assert (advantages * change).sum() > 0


def _toy_reward(trainer) -> float:
    """Redness of 4 train prompts x 4 fixed seeds under the trainer's current policy."""
    from margrpo.train.evaluate import generate_images

    prompts = trainer.train_prompts[:4]
    _, images = generate_images(trainer.policy, trainer.sampler, trainer.config.rollout, prompts, 4, seed=99)
    return Redness(device="cpu")(images, [p for p in prompts for _ in range(4)]).mean().item()


def test_training_improves_a_toy_reward(tmp_path):
    # The shipped pretrained checkpoint: its samples follow their prompts (so redness varies within
    # a group and the reward has signal), unlike a random-init model whose samples are mostly noise.
    # Measured on three run seeds: redness 0.06 -> 0.52, 0.60, 0.22 after 8 steps.
    trainer = make(
        tmp_path,
        "builtin:shapes-tiny",
        "optim.lr=1e-3",
        "grpo.kl_beta=0",
        "grpo.prompts_per_step=4",
        "grpo.head=train",
        "rollout.num_mask_steps=8",
        "rollout.cfg_scale=3.0",
        "backbone.diffusion_steps=10",
    )
    before = _toy_reward(trainer)
    for _ in range(8):
        trainer.train_step()
        trainer.step += 1
    after = _toy_reward(trainer)
    assert after > before, f"toy reward did not improve: {before:.4f} -> {after:.4f}"


def test_resume_gives_identical_weights(tmp_path, tiny_checkpoint):
    straight = make(tmp_path / "a", tiny_checkpoint, "run.steps=4", "run.save_every=0")
    straight.run()
    half = make(tmp_path / "b", tiny_checkpoint, "run.steps=2", "run.save_every=2")
    half.run()
    resumed = make(tmp_path / "b", tiny_checkpoint, "run.steps=4", "run.save_every=2")
    assert resumed.step == 2
    resumed.run()
    for (name, a), (_, b) in zip(straight.policy.named_parameters(), resumed.policy.named_parameters()):
        assert torch.equal(a, b), f"{name} differs after resume"


def test_resume_continues_the_log_from_the_checkpoint(tmp_path, tiny_checkpoint):
    """A process killed after its last checkpoint leaves later records and a torn line in
    metrics.jsonl; the resumed run drops them and logs every step exactly once."""
    import json

    from margrpo.train.metrics import plot_curves, read_metrics

    make(tmp_path, tiny_checkpoint, "run.steps=2", "run.save_every=2").run()
    log = tmp_path / "run" / "metrics.jsonl"
    with open(log, "a") as handle:  # steps 3 and 4 of a process killed before its next save, mid-line
        handle.write(json.dumps({"kind": "train", "step": 3, "reward_mean": 9.0}) + "\n")
        handle.write(json.dumps({"kind": "train", "step": 4, "reward_mean": 9.0}) + "\n")
        handle.write('{"kind": "train", "step": 5, "rew')
    resumed = make(tmp_path, tiny_checkpoint, "run.steps=4", "run.save_every=2")
    assert resumed.step == 2
    resumed.run()
    steps = [r["step"] for r in read_metrics(log) if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]
    assert all(r.get("reward_mean") != 9.0 for r in read_metrics(log))
    assert all(json.loads(line) for line in log.read_text().splitlines())  # every line whole again
    assert plot_curves(log, tmp_path / "curve.png") is not None


def test_resume_refuses_changed_settings_by_name(tmp_path, tiny_checkpoint):
    make(tmp_path, tiny_checkpoint, "run.steps=1", "run.save_every=1").run()
    saved = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"optim\.lr: 0\.001 -> 0\.01") as err:
        make(tmp_path, tiny_checkpoint, "run.steps=2", "optim.lr=1e-2")
    assert "run.steps" not in str(err.value).split("A resumed run")[0]  # an allowed change, not refused
    with pytest.raises(ConfigError, match="grpo.head: 'frozen' -> 'train'"):
        make(tmp_path, tiny_checkpoint, "grpo.head=train")
    assert (tmp_path / "run" / "config.yaml").read_text() == saved  # not overwritten by a refused config
    resumed = make(tmp_path, tiny_checkpoint, "run.steps=2", "run.eval_every=5")  # allowed overrides apply
    assert resumed.step == 1 and resumed.config.run.steps == 2


def test_sigterm_saves_a_checkpoint_and_exits(tmp_path, tiny_checkpoint):
    SigtermOnSecondCall.calls = 0
    trainer = make(tmp_path, tiny_checkpoint, "run.steps=5", "rewards={test_sigterm_on_second_call: 1.0}")
    trainer.run()  # call 1: the "before" evaluation; call 2: step 1's reward, which raises SIGTERM
    assert trainer.step == 1
    latest = ckpt.latest(tmp_path / "run" / "checkpoints")
    assert latest is not None and ckpt.verify(latest)["step"] == 1
    assert trainer.stop_signal == signal.SIGTERM


def test_a_signal_stop_exits_with_128_plus_the_signal(tmp_path, tiny_checkpoint):
    from margrpo.train.trainer import main

    SigtermOnSecondCall.calls = 0
    config = str(Path(__file__).parent / "empty.yaml")
    stopped = overrides(tmp_path / "a", tiny_checkpoint, "run.steps=5", "rewards={test_sigterm_on_second_call: 1.0}")
    assert main(["--config", config, *stopped]) == 128 + signal.SIGTERM
    assert main(["--config", config, *overrides(tmp_path / "b", tiny_checkpoint, "run.steps=1")]) == 0


def test_non_finite_rewards_are_skipped_then_stop(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "run.steps=5", "run.max_bad_steps=2", "rewards={test_nan: 1.0}")
    before = {k: v.clone() for k, v in trainer.policy.named_parameters()}
    with pytest.raises(TrainingStopped, match="2 consecutive steps had a non-finite reward"):
        trainer.run()
    assert trainer.skipped_total == 2
    assert all(torch.equal(v, before[k]) for k, v in trainer.policy.named_parameters())


def test_a_skipped_step_changes_nothing(tmp_path, tiny_checkpoint, monkeypatch):
    """grpo.minibatches=2 with a NaN loss in the second minibatch: the first minibatch's optimizer
    step has already moved the weights and Adam's state; the skipped step must undo it."""
    import copy
    import dataclasses

    from margrpo.grpo import policy_update

    trainer = make(tmp_path, tiny_checkpoint, "grpo.minibatches=2", "grpo.kl_beta=0")
    trainer.train_step()  # Adam's moments and step counts are non-trivial from here on
    trainer.step += 1
    weights = {k: v.detach().clone() for k, v in trainer.policy.named_parameters() if v.requires_grad}
    optimizer = copy.deepcopy(trainer.optimizer.state_dict())
    losses, optimizer_steps = [], []
    original_loss, original_step = policy_update._chunk_loss, trainer.optimizer.step

    def nan_in_second_minibatch(*args, **kwargs):
        out = original_loss(*args, **kwargs)
        losses.append(out)
        return dataclasses.replace(out, loss=out.loss * float("nan")) if len(losses) == 2 else out

    def count_step(*args, **kwargs):
        optimizer_steps.append(1)
        return original_step(*args, **kwargs)

    monkeypatch.setattr(policy_update, "_chunk_loss", nan_in_second_minibatch)
    trainer.optimizer.step = count_step
    metrics = trainer.train_step()
    assert metrics["skipped"] == "loss" and len(optimizer_steps) == 1  # the first minibatch did step
    for name, param in trainer.policy.named_parameters():
        if param.requires_grad:
            assert torch.equal(param.detach(), weights[name]), f"{name} changed in a skipped step"
    after = trainer.optimizer.state_dict()
    assert after["state"].keys() == optimizer["state"].keys()
    for index, values in optimizer["state"].items():
        for key, value in values.items():
            assert torch.equal(after["state"][index][key], value), (index, key)


def test_config_errors_name_the_key(tmp_path, tiny_checkpoint):
    with pytest.raises(ConfigError, match="grpo.kl_bta.*kl_beta"):
        load_config(None, overrides(tmp_path, tiny_checkpoint, "grpo.kl_bta=0.1"))
    with pytest.raises(ConfigError, match="rollout.num_seeds"):
        load_config(None, overrides(tmp_path, tiny_checkpoint, "grpo.mte=true"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        make(tmp_path, tiny_checkpoint, f"run.train_prompts={tmp_path / 'missing.txt'}")


def test_two_process_gloo_matches_one_process(tmp_path, tiny_checkpoint):
    """torchrun with 2 CPU ranks x P prompts == 1 process x 2P prompts (same per-sample seeds)."""
    # a registered reward the child processes know (the test_* rewards live only in this process)
    common = overrides(
        tmp_path, tiny_checkpoint, "run.steps=1", "grpo.kl_beta=0.01", "run.save_every=1", "rewards={jpeg_incompressibility: 1.0}"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = [f"run.out_dir={tmp_path / 'one'}", "grpo.prompts_per_step=4"]
    two = [f"run.out_dir={tmp_path / 'two'}", "grpo.prompts_per_step=2"]
    subprocess.run(
        [sys.executable, "-m", "margrpo.cli", "train", "--config", str(ROOT / "tests" / "empty.yaml"), *common, *one],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--standalone",
            "-m",
            "margrpo.cli",
            "train",
            "--config",
            str(ROOT / "tests" / "empty.yaml"),
            *common,
            *two,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    w1, _ = ckpt.load(ckpt.latest(tmp_path / "one" / "checkpoints"))
    w2, _ = ckpt.load(ckpt.latest(tmp_path / "two" / "checkpoints"))
    assert w1.keys() == w2.keys()
    start = TinyMAR.load(tiny_checkpoint).state_dict()
    moved = max((w1[k] - start[k]).abs().max().item() for k in w1)
    assert moved > 0
    # Adam turns fp32 summation-order noise in near-zero gradients into updates of up to ~lr, so
    # compare the update vectors as a whole (and each element loosely)
    d1 = torch.cat([(w1[k] - start[k]).flatten() for k in w1])
    d2 = torch.cat([(w2[k] - start[k]).flatten() for k in w1])
    assert (d2 - d1).norm() / d1.norm() < 1e-2
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=0.05 * moved)


def test_ablation_table_reports_paired_gains_with_intervals(tmp_path):
    from margrpo.train.ablate import LADDER, format_table, plot_gains, seed_stats

    results = {
        rung: [
            {"before": {"heldout/overall": 0.3}, "after": {"heldout/overall": 0.3 + 0.1 * i + s, "heldout/color": 0.5}, "kl": 1e-3}
            for s in (0.0, 0.2)
        ]
        for i, rung in enumerate(LADDER)
    }
    table = format_table(results).splitlines()
    assert table[0].split(" | ")[:6] == ["rung", "seeds", "overall before", "overall after", "gain mean", "gain 95% CI"]
    assert len(table) == 2 + len(LADDER)
    last = table[-1].split(" | ")
    i = len(LADDER) - 1
    assert last[0] == "preset" and last[1] == "2"
    assert float(last[4]) == pytest.approx(0.1 * i + 0.1)
    # two seeds: t(1) = 12.706, sd = 0.1414: half-width 12.706 * 0.1414 / sqrt(2) = 1.2706
    low, high = (float(x) for x in last[5].strip("[]").split(", "))
    assert high - low == pytest.approx(2 * 1.2706, abs=2e-3)
    assert float(last[7]) == pytest.approx(0.1 * i)  # the smaller gain
    stats = seed_stats([1.0, 2.0, 3.0, float("nan")])
    assert stats["n"] == 3 and stats["mean"] == 2.0 and stats["sd"] == 1.0
    assert stats["ci95"] == pytest.approx(4.303 / 3**0.5)
    assert plot_gains(results, tmp_path / "a.png").stat().st_size > 1000


def test_micro_batches_accumulate_to_the_same_update(tmp_path, tiny_checkpoint):
    """Token weights are normalised over the whole batch, so splitting a minibatch into micro-batches
    (gradient accumulation) or by mask steps gives the same gradient as one pass."""
    grads = []
    for extra in (
        [],
        ["grpo.micro_batches=4"],
        ["grpo.minibatch_over=mask_steps", "grpo.minibatches=2"],
        ["grpo.micro_batches=2", "grpo.micro_batch_over=mask_steps"],
    ):
        # lr 0 and no clipping: the captured gradients of all updates add up to the full-batch gradient
        trainer = make(tmp_path / str(len(grads)), tiny_checkpoint, "grpo.kl_beta=0.1", "optim.lr=0", "optim.grad_clip=1e9", *extra)
        captured = {}
        original_step = trainer.optimizer.step

        def capture(*args, _captured=captured, _trainer=trainer, **kwargs):
            for name, p in _trainer.policy.named_parameters():
                if p.grad is not None:
                    _captured[name] = _captured.get(name, 0) + p.grad.clone()
            return original_step(*args, **kwargs)

        trainer.optimizer.step = capture
        trainer.train_step()
        grads.append(captured)
    for other in grads[1:]:
        assert other.keys() == grads[0].keys()
        for name in grads[0]:
            torch.testing.assert_close(other[name], grads[0][name], rtol=1e-4, atol=1e-7)


def test_resume_accepts_settings_newer_than_the_checkpoint_at_their_defaults():
    """A checkpoint written before a setting existed did what its default does: resuming with the
    default is not a change; any other value is refused by name."""
    import yaml

    from margrpo.config import to_dict
    from margrpo.train.config import load_config
    from margrpo.train.trainer import check_resume_config

    current = to_dict(load_config("configs/shapes-tiny.yaml"))
    saved = yaml.safe_load(yaml.safe_dump(current))
    del saved["grpo"]["estimator"], saved["grpo"]["matching_times"], saved["rollout"]["seed_chains"]
    assert check_resume_config(saved, 1, current, 1, "ckpt") == []
    changed = to_dict(load_config("configs/shapes-tiny.yaml", ["grpo.estimator=matching"]))
    with pytest.raises(ConfigError, match="grpo.estimator: '<unset>' -> 'matching'"):
        check_resume_config(saved, 1, changed, 1, "ckpt")


def test_ablate_estimator_flag_sets_the_estimator_of_every_rung(tmp_path, monkeypatch):
    from margrpo.train import ablate

    seen = []

    def fake_run(config, overrides, rung, seed, out_dir, positions=None):
        seen.append((rung, list(overrides), positions))
        return {"before": {"heldout/overall": 0.3}, "after": {"heldout/overall": 0.4}, "kl": 0.01}

    monkeypatch.setattr(ablate, "run_one", fake_run)
    args = ["--config", "c.yaml", "--out", str(tmp_path), "--seeds", "0", "--rungs", "grpo", "mte"]
    assert ablate.main([*args, "--estimator", "matching", "run.steps=2"]) == 0
    assert [rung for rung, _, _ in seen] == ["grpo", "mte"]
    assert all(o == ["run.steps=2", "grpo.estimator=matching"] and p is None for _, o, p in seen)
    seen.clear()
    assert ablate.main([*args, "--positions", "unknown"]) == 0
    assert [p for _, _, p in seen] == ["unknown", "unknown"]
    with pytest.raises(SystemExit):
        ablate.main([*args, "--estimator", "matching", "grpo.estimator=transition"])


def test_ablate_positions_replace_the_rungs_own(tmp_path, monkeypatch):
    """--positions unknown reaches the trainer after the rung's own likelihood positions."""
    from margrpo.train import ablate, trainer

    built = []

    class Stop(Exception):
        pass

    def fake_from_files(config, overrides):
        built.append(overrides)
        raise Stop

    monkeypatch.setattr(trainer.Trainer, "from_files", staticmethod(fake_from_files))
    with pytest.raises(Stop):
        ablate.run_one("c.yaml", ["run.steps=2"], "frozen_head", 3, tmp_path / "run", positions="unknown")
    overrides = built[0]
    assert overrides.index("rollout.likelihood_positions=unknown") > overrides.index("rollout.likelihood_positions=revealed")
    assert overrides[0] == "run.steps=2" and "run.seed=3" in overrides


@pytest.mark.parametrize(
    "preset, deferred",
    [("nova-512", True), ("harmon-1.5b", True), ("nova-512-parity", False), ("harmon-1.5b-parity", False)],
)
def test_training_rollouts_defer_seed_chains_where_the_update_knows_its_mte_tokens(preset, deferred):
    """The NOVA and Harmon presets draw a recorded step's seed chains past its committed tokens for
    the MTE tokens only; the parity presets draw a random MTE position in the update, after the
    rollout, so they draw them all. The selection handed to generate is the update's MTE tokens."""
    from margrpo.grpo.selection import mte_mask
    from margrpo.train.step import deferred_seed_selection

    config = load_config(Path(__file__).parent.parent / "configs" / f"{preset}.yaml")
    select = deferred_seed_selection(config)
    assert (select is not None) is deferred
    if deferred:  # each of these switches turns it off
        for override in ("grpo.mte=false", "rollout.seed_chains=commit", "grpo.estimator=matching", "grpo.mte_random_positions=1"):
            assert deferred_seed_selection(load_config(Path(__file__).parent.parent / "configs" / f"{preset}.yaml", [override])) is None
        seeds = torch.randn(3, 2, 16, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        g = config.grpo
        expected = mte_mask(seeds, g.mte_ratio, g.pixels_per_token, k_rule=g.mte_k).any(-1)
        assert torch.equal(select(seeds), expected) and 0 < int(expected.sum()) < expected.numel()
