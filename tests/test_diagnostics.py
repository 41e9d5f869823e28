"""margrpo.train.diagnostics (the four checks of `margrpo diagnose`) and run.train_prompt_mix."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

from conftest import make_small_trainer, make_tiny_checkpoint
from margrpo.config import ConfigError
from margrpo.rewards import Reward, register
from margrpo.rollout import generate
from margrpo.train import diagnostics
from margrpo.train.step import record_plan, step_prompts
from margrpo.train.trainer import Trainer


@register("test_diagnostics_brightness")
class Brightness(Reward):
    """A continuous toy reward (never ties within a group)."""

    def score(self, images, prompts, metadata):
        return images.mean((1, 2, 3))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def make(tmp_path, checkpoint, *extra) -> Trainer:
    return make_small_trainer(
        tmp_path,
        checkpoint,
        "rollout.num_mask_steps=4",
        "rollout.record_mask_steps=2",
        "rollout.record_diffusion_steps=2",
        "rollout.num_seeds=2",
        "grpo.mte=true",
        "grpo.group_size=4",
        "grpo.prompts_per_step=2",
        "optim.lr=1e-3",
        *extra,
    )


def rollout_of(trainer):
    prompts, seeds, _ = step_prompts(trainer, 0)
    return generate(trainer.policy, prompts, trainer.config.rollout, seeds, sampler=trainer.sampler, plan=record_plan(trainer, 0))


def test_recorded_logp_error_is_rounding_and_sees_a_wrong_record(tmp_path, tiny_checkpoint):
    rollout = rollout_of(make(tmp_path, tiny_checkpoint))
    assert rollout.logp.numel() > 0
    assert diagnostics.recorded_logp_error(rollout) < 1e-3  # fp32 rounding of a 48-channel sum
    rollout.logp[0, 1, 3] += 0.5
    assert diagnostics.recorded_logp_error(rollout) == pytest.approx(0.5, abs=1e-3)


def test_first_update_log_ratio_is_zero_in_float64_and_sees_a_changed_policy(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "grpo.kl_beta=0")
    trainer.policy.double()
    rollout = rollout_of(trainer)
    assert rollout.logp.dtype == torch.float64
    assert diagnostics.first_update_log_ratio(trainer, rollout) < 1e-9
    with torch.no_grad():  # a policy other than the sampling one is off-policy at once
        for p in trainer.policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    assert diagnostics.first_update_log_ratio(trainer, rollout) > 1e-4


def test_zero_variance_fraction_counts_flat_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.3])
    assert diagnostics.zero_variance_fraction(rewards, 4) == pytest.approx(1 / 3)
    assert diagnostics.zero_variance_fraction(rewards, 2) == pytest.approx(4 / 6)


def test_diagnose_restores_the_policy_and_leaves_the_optimizer_untouched(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "rewards={test_diagnostics_brightness: 1.0}")
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    etas = (0.0, 1e-3, 1e-2)
    result = diagnostics.diagnose(trainer, etas=etas, samples_per_prompt=2)
    after = trainer.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not trainer.optimizer.state  # Adam never stepped
    assert trainer.step == 0
    assert len(result.scans) == 2
    for scan in result.scans:
        assert scan.etas == list(etas) and len(scan.reward) == len(etas)
        assert scan.gain[0] == 0.0 and scan.gain_se[0] == 0.0
    # a step along the direction changes the samples (the direction is not zero)
    assert any(g != 0.0 for scan in result.scans for g in scan.gain[1:])
    assert result.grad_norm > 0
    assert 0.0 <= result.zero_variance_fraction <= 1.0
    assert "max |log ratio|" in result.table()


def test_train_step_reports_the_zero_variance_fraction(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "rewards={test_diagnostics_brightness: 1.0}")
    metrics = trainer.train_step()
    assert metrics["zero_variance_fraction"] == 0.0  # a continuous reward never ties
    # a reward that ignores the image: every group is flat
    trainer.reward = lambda images, prompts, metadata: type(
        "R", (), {"total": torch.zeros(len(prompts)), "raw": {}, "log_values": lambda self, prefix: {}}
    )()
    trainer.step = 1
    assert trainer.train_step()["zero_variance_fraction"] == 1.0


def test_category_prompt_mix_trains_every_category_equally_often(tmp_path, tiny_checkpoint):
    from margrpo.testbed.grammar import parse_prompt

    def draws(mix):
        trainer = make(tmp_path, tiny_checkpoint, f"run.train_prompt_mix={mix}", "grpo.prompts_per_step=50")
        prompts = [p for step in range(8) for p in step_prompts(trainer, step)[0][:: trainer.config.grpo.group_size]]
        return Counter(parse_prompt(p).category for p in prompts)

    uniform, balanced = draws("uniform"), draws("category")
    assert sum(balanced.values()) == 400
    assert set(balanced) == {"single", "binding", "counting", "spatial"}
    assert max(balanced.values()) < 140 and min(balanced.values()) > 60  # 100 each expected
    assert uniform["spatial"] > 250  # the train split is about 81% spatial


def test_category_prompt_mix_needs_shapesworld_prompts(tmp_path, tiny_checkpoint):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a photo of a cat\n")
    with pytest.raises(ConfigError, match="run.train_prompt_mix"):
        make(tmp_path, tiny_checkpoint, "run.train_prompt_mix=category", f"run.train_prompts={prompts}")


def test_gradient_variance_is_paired_and_restores_the_settings(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "rewards={test_diagnostics_brightness: 1.0}")
    same = {"a": {"mte": True}, "b": {"mte": True}, "off": {"mte": False}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lines: list[str] = []
        a, b, off = diagnostics.gradient_variance(trainer, rollouts=3, variants=same, progress=lines.append)
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]  # the stand-in optimizer's, silenced
    assert lines[0] == "variant 1/3 (a): rollout 1/3" and lines[-1] == "variant 3/3 (off): rollout 3/3" and len(lines) == 9
    assert a.total_variance > 0 and a.mean_sq_norm > 0
    assert a.signal_sq_norm == pytest.approx(a.mean_sq_norm - a.total_variance / 3)
    assert a.total_variance == pytest.approx(b.total_variance, rel=1e-12)  # same rollouts, same estimate
    assert off.total_variance != pytest.approx(a.total_variance, rel=1e-6)  # MTE changes the estimate
    assert trainer.config.grpo.mte is True and trainer.step == 0
    with pytest.raises(ValueError, match="rollouts"):
        diagnostics.gradient_variance(trainer, rollouts=1)
    ratio, low, high = diagnostics.variance_ratio(a, b)
    assert ratio == pytest.approx(1, rel=1e-12) and low == pytest.approx(1, rel=1e-9) and high == pytest.approx(1, rel=1e-9)
    ratio, low, high = diagnostics.variance_ratio(off, a)
    assert ratio == pytest.approx(off.total_variance / a.total_variance) and low <= high


def test_variance_ratio_bootstrap_matches_direct_resampling():
    generator = torch.Generator().manual_seed(0)
    n, dim = 7, 50
    flats = {
        "x": torch.randn(n, dim, generator=generator, dtype=torch.float64),
        "y": 3 * torch.randn(n, dim, generator=generator, dtype=torch.float64),
    }

    def result(name):
        flat = flats[name]
        total = float((flat - flat.mean(0)).pow(2).sum() / (n - 1))
        return diagnostics.GradientVariance(name, n, 0.0, total, 0.0, 0.0, gram=flat @ flat.T)

    x, y = result("x"), result("y")
    # the Gram-matrix form of one resample equals the variance computed from the resampled rows
    picks = torch.tensor([0, 0, 3, 5, 5, 5, 6])
    counts = torch.bincount(picks, minlength=n).double()
    direct = float((flats["x"][picks] - flats["x"][picks].mean(0)).pow(2).sum() / (n - 1))
    assert float(diagnostics._total_variance(x.gram, counts)) == pytest.approx(direct, rel=1e-12)
    ratio, low, high = diagnostics.variance_ratio(x, y)
    assert ratio == pytest.approx(x.total_variance / y.total_variance)
    assert low < ratio < high and high < 1  # y's gradients are 3x larger: the ratio is near 1/9
    with pytest.raises(ValueError, match="same rollouts"):
        diagnostics.variance_ratio(x, diagnostics.GradientVariance("z", n, 0.0, 1.0, 0.0, 0.0))


def test_common_group_noise_shares_the_order_within_groups_only(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "grpo.group_noise=common")
    prompts, rollout = trainer.rollout(0)
    groups = rollout.order.view(2, 4, -1)
    assert all(torch.equal(g[0], g[i]) for g in groups for i in range(4))
    assert not torch.equal(groups[0, 0], groups[1, 0])
    independent = make(tmp_path, tiny_checkpoint)
    _, own = independent.rollout(0)
    assert not torch.equal(own.order[0], own.order[1])
    # the recorded noise is each sample's own: a group's recorded log-probs differ
    assert not torch.allclose(rollout.logp[:, 0], rollout.logp[:, 1])


def test_antithetic_group_noise_mirrors_pairs_and_trains(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "grpo.group_noise=antithetic", "rewards={test_diagnostics_brightness: 1.0}")
    _, rollout = trainer.rollout(0)
    groups = rollout.order.view(2, 4, -1)
    assert all(torch.equal(g[0], g[i]) for g in groups for i in range(4))
    drawn = (rollout.x_prev[0] - rollout.mean[0]) / rollout.std[0]  # [B, L, C], the main trajectory
    torch.testing.assert_close(drawn[1::2], -drawn[0::2], atol=1e-5, rtol=1e-5)
    assert (drawn[2] + drawn[0]).abs().max() > 1e-2
    metrics = trainer.train_step()
    assert metrics["updates"] == 1 and metrics["grad_norm"] > 0
    with pytest.raises(ConfigError, match="even"):
        make(tmp_path, tiny_checkpoint, "grpo.group_noise=antithetic", "grpo.group_size=3")


def test_diagnose_compare_names_a_grpo_setting():
    with pytest.raises(SystemExit) as exit_info:
        diagnostics.main(["--config", "configs/shapes-tiny.yaml", "--variance", "2", "--compare", "grpo.nonsense=1,2"])
    assert exit_info.value.code == 2


def _synthetic(name, flat):
    n = flat.shape[0]
    mean = flat.mean(0)
    total = float((flat - mean).pow(2).sum() / (n - 1))
    sq = float(mean.pow(2).sum())
    return diagnostics.GradientVariance(name, n, sq, total, total / sq, sq - total / n, gram=flat @ flat.T, flat=flat)


def test_signal_to_noise_and_its_interval_cover_a_known_value():
    """Gradients = signal + unit noise in 40 dims, |signal|^2 = 40 * 0.25: the per-rollout SNR is
    0.25 and its bootstrap interval over 400 rollouts covers it (and excludes 0 and 0.5)."""
    generator = torch.Generator().manual_seed(1)
    n, dim = 400, 40
    signal = torch.full((dim,), 0.5, dtype=torch.float64)
    result = _synthetic("s", signal + torch.randn(n, dim, generator=generator, dtype=torch.float64))
    assert result.signal_to_noise == pytest.approx(0.25, abs=0.05)
    low, high = diagnostics.signal_to_noise_interval(result)
    assert low < 0.25 < high and low > 0.1 and high < 0.5


def test_mean_cosine_separates_aligned_from_orthogonal_estimators():
    generator = torch.Generator().manual_seed(2)
    n, dim = 200, 30
    direction = torch.zeros(dim, dtype=torch.float64)
    direction[0] = 1.0
    other = torch.zeros(dim, dtype=torch.float64)
    other[1] = 1.0
    noise = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    a = _synthetic("a", 2 * direction + noise)
    same = _synthetic("b", 2 * direction + 0.5 * noise + 0.5 * torch.randn(n, dim, generator=generator, dtype=torch.float64))
    orthogonal = _synthetic("c", 2 * other + torch.randn(n, dim, generator=generator, dtype=torch.float64))
    cosine, low, high = diagnostics.mean_cosine(a, same)
    assert cosine > 0.8 and low > 0.6
    cosine, low, high = diagnostics.mean_cosine(a, orthogonal)
    assert abs(cosine) < 0.3 and low < 0 < high


def test_self_consistency_is_one_when_the_policy_draws_data(tmp_path, tiny_checkpoint):
    """Scoring a rollout against its own tokens as "data" gives ratio 1 in every bin; other data gives
    other errors; a shape mismatch is named."""
    trainer = make(tmp_path, tiny_checkpoint)
    _, rollout = trainer.rollout(0)
    same = diagnostics.head_self_consistency(trainer, rollout, rollout.tokens.clone(), draws=4, edges=(0, 500, 1000))
    assert same.policy_error == pytest.approx(same.data_error, rel=1e-6)
    assert all(e > 0 for e in same.policy_error)
    other = diagnostics.head_self_consistency(trainer, rollout, torch.rand_like(rollout.tokens) * 2 - 1, draws=4, edges=(0, 500, 1000))
    assert other.policy_error == pytest.approx(same.policy_error)
    assert other.data_error != pytest.approx(same.data_error, rel=1e-9, abs=0)
    assert "ratio" in other.table()
    with pytest.raises(ValueError, match="data_tokens"):
        diagnostics.head_self_consistency(trainer, rollout, rollout.tokens[:1])


def test_variants_may_change_rollout_settings_and_are_restored(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "rewards={test_diagnostics_brightness: 1.0}")
    variants = {"base": {}, "colder": {"rollout.temperature": 0.5}, "matching": {"grpo.estimator": "matching", "grpo.mte": False}}
    base, colder, matching = diagnostics.gradient_variance(trainer, rollouts=2, variants=variants)
    assert not torch.allclose(base.flat, colder.flat)  # the rollouts were drawn at another temperature
    assert not torch.allclose(base.flat, matching.flat)
    assert trainer.config.rollout.temperature == 1.0 and trainer.config.grpo.estimator == "transition"
    assert trainer.config.grpo.mte is True


def test_diagnose_variant_names_a_bad_setting():
    for spec in ("a:grpo.nonsense=1", "a:rollout.nope=2", "a:other.mte=true"):
        with pytest.raises(SystemExit) as exit_info:
            diagnostics.main(["--config", "configs/shapes-tiny.yaml", "--variance", "2", "--variant", spec, "--variant", "b:"])
        assert exit_info.value.code == 2


def test_direction_gains_are_paired_and_restore_policy_and_settings(tmp_path, tiny_checkpoint):
    trainer = make(tmp_path, tiny_checkpoint, "rewards={test_diagnostics_brightness: 1.0}")
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    variants = {"a": {"mte": True}, "b": {"mte": True}, "off": {"mte": False}, "cold": {"rollout.temperature": 0.5}}
    still = diagnostics.direction_gains(trainer, 3, variants, eta=0.0, samples_per_prompt=2)
    assert [r.gains for r in still] == [[0.0] * 3] * 4  # no step: the paired samples are the same images
    lines = []
    a, b, off, cold = diagnostics.direction_gains(
        trainer, 3, variants, eta=1e-2, samples_per_prompt=2, direction="rms", progress=lines.append
    )
    assert len(lines) == 3 and lines[-1].startswith("rollout 3/3 (step 2): a ") and f"off {off.gains[-1]:+.4f}" in lines[-1]
    (later,) = diagnostics.direction_gains(trainer, 3, {"a": {"mte": True}}, eta=1e-2, samples_per_prompt=2, direction="rms", first_step=1)
    assert later.gains[:2] == a.gains[1:]  # steps 1 and 2 again: the same rollouts and fresh samples
    (at_lr,) = diagnostics.direction_gains(trainer, 3, {"a": {"mte": True}}, samples_per_prompt=2)  # eta: optim.lr, 1e-3 here
    (explicit,) = diagnostics.direction_gains(trainer, 3, {"a": {"mte": True}}, eta=1e-3, samples_per_prompt=2)
    assert at_lr.eta == 1e-3 and at_lr.gains == explicit.gains
    assert a.gains == b.gains  # same rollouts, same settings: the same direction and the same samples
    assert any(g != 0.0 for g in a.gains) and off.gains != a.gains and cold.gains != a.gains
    assert all(torch.equal(before[k], v) for k, v in trainer.policy.state_dict().items())
    assert not trainer.optimizer.state and trainer.step == 0
    assert trainer.config.grpo.mte is True and trainer.config.rollout.temperature == 1.0
    with pytest.raises(ValueError, match="rollouts: got 2"):
        diagnostics.direction_gains(trainer, 2, variants)
    with pytest.raises(ValueError, match="direction: got 'adam'"):
        diagnostics.direction_gains(trainer, 3, variants, direction="adam")


def test_gain_statistics_are_paired_t_and_jackknife_intervals():
    a = diagnostics.DirectionGains("a", 1e-4, "sign", [0.02, 0.04, 0.06, 0.08])
    b = diagnostics.DirectionGains("b", 1e-4, "sign", [0.01, 0.02, 0.03, 0.04])
    mean, low, high = a.mean_interval()
    assert mean == pytest.approx(0.05) and low < mean < high
    half = 3.182 * float(torch.tensor(a.gains, dtype=torch.float64).std()) / 2  # t(3) * sd / sqrt(4)
    assert high - mean == pytest.approx(half)
    diff, d_low, d_high = diagnostics.paired_gain_difference(a, b)
    assert diff == pytest.approx(0.025) and d_low < diff < d_high
    ratio, r_low, r_high = diagnostics.gain_ratio(a, b)
    assert ratio == pytest.approx(2.0) and r_low == pytest.approx(2.0) and r_high == pytest.approx(2.0)  # a = 2 b exactly
    table = diagnostics.gains_table([b, a])
    assert "+0.0250 [" in table and "2.00 [2.00, 2.00]" in table and "per rollout" in table
    with pytest.raises(ValueError, match="same >= 3 rollouts"):
        diagnostics.gain_ratio(a, diagnostics.DirectionGains("c", 1e-4, "sign", [0.1, 0.2]))
