"""The GRPO-step benchmark (margrpo bench step): both paths run on the shipped shapes-tiny checkpoint at
tiny settings, phases are positive and add up, the JSON report has its keys, and the images the fused
path hands to the reward are the trainer's rollout of the step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from margrpo.bench import step as bench_step
from margrpo.bench.cli import main as bench_main
from margrpo.rollout import generate
from margrpo.train.step import record_plan, step_prompts

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "shapes-tiny.yaml"
TINY = [
    "backbone.checkpoint=builtin:shapes-tiny",
    "grpo.prompts_per_step=1",
    "grpo.group_size=4",
    "rollout.num_mask_steps=4",
    "backbone.diffusion_steps=4",
    "rollout.record_mask_steps=2",
    "rollout.record_diffusion_steps=2",
    "run.threads=1",
]
COLUMNS = ("rollout", "reward", "train", "total")


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_config_gets_the_reference_algorithm_and_rejects_overriding_it():
    config = bench_step.load_bench_config(CONFIG, TINY)
    g = config.grpo
    assert (g.objective, g.likelihood_cfg, g.minibatch_over, g.kl_type) == ("reinforce", "none", "mask_steps", "parity_mean_k3")
    assert config.rollout.likelihood_positions == "unknown"
    assert g.minibatches == config.rollout.record_mask_steps == 2
    assert (g.prompts_per_step, g.group_size, config.rollout.num_mask_steps) == (1, 4, 4)
    assert g.group_noise == "independent"  # the reference draws every sample on its own
    with pytest.raises(ValueError, match="grpo.objective"):
        bench_step.load_bench_config(CONFIG, [*TINY, "grpo.objective=clip"])
    with pytest.raises(ValueError, match="grpo.minibatches"):
        bench_step.load_bench_config(CONFIG, [*TINY, "grpo.minibatches=1"])


def test_both_paths_run_and_the_fused_images_are_the_trainers_rollout():
    bench = bench_step.StepBench(bench_step.load_bench_config(CONFIG, TINY))
    trainer = bench.trainer
    before = {name: p.detach().clone() for name, p in trainer.policy.named_parameters()}
    prompts, seeds, _ = step_prompts(trainer, 1)
    expected = generate(
        bench.policy, prompts, trainer.config.rollout, seeds, sampler=trainer.sampler, plan=record_plan(trainer, 1)
    ).images  # the reference path's copy is still the starting policy

    for path, run_step in (("fused", bench.fused), ("reference", bench.reference)):
        times, images, rewards = run_step(1)
        assert set(times) == {"rollout", "reward", "train"} and all(t > 0 for t in times.values()), path
        assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32, path
        assert torch.isfinite(images).all() and images.min() >= 0 and images.max() <= 1, path
        assert images.std() > 0.05, f"{path}: a blank image batch"
        assert rewards.shape == (4,) and ((rewards >= 0) & (rewards <= 1)).all(), path
        if path == "fused":
            torch.testing.assert_close(images, expected, rtol=0, atol=1e-6)

    # each path updated its own policy's body and left its diffusion head alone
    for policy in (trainer.policy, bench.policy):
        named = dict(policy.named_parameters())
        assert any(not torch.equal(named[n], before[n]) for n in before if not n.startswith("head."))
        assert all(torch.equal(named[n], before[n]) for n in before if n.startswith("head."))


def test_cli_prints_the_table_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "step.json"
    assert bench_main(["step", "--config", str(CONFIG), "--steps", "3", "--json", str(out), *TINY]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {
        "machine",
        "settings",
        "steps",
        "rows",
        "order",
        "mean_s",
        "stats_s",
        "speedup",
        "speedup_p20",
        "speedup_p80",
        "command",
    }
    machine = report["machine"]
    assert {
        "cpu_count",
        "torch_threads",
        "load_average_before",
        "load_average_after",
        "torch",
        "triton",
        "margrpo",
        "python",
        "cpu",
        "load_average",
    } <= set(machine)
    assert machine["torch_threads"] == report["settings"]["torch_threads"] == 1
    assert report["settings"]["images"] == 4 and report["settings"]["algorithm"]["grpo.minibatches"] == 2
    rows, order = report["rows"], report["order"]
    assert len(order) == 3 and all(sorted(o) == sorted(bench_step.PATHS) for o in order)
    # the rows in the recorded interleaving order, both paths of round r on step r
    assert [(r["step"], r["path"]) for r in rows] == [(i + 1, p) for i, o in enumerate(order) for p in o]
    for row in rows:
        assert all(row[c] > 0 for c in COLUMNS)
        assert row["total"] == pytest.approx(row["rollout"] + row["reward"] + row["train"], rel=1e-12)
    seconds = {(r["step"], r["path"]): r for r in rows}
    for c in COLUMNS:
        for path in bench_step.PATHS:
            st = report["stats_s"][path][c]
            assert st["min"] <= st["p20"] <= st["p50"] <= st["p80"]
            assert report["mean_s"][path][c] == pytest.approx(sum(r[c] for r in rows if r["path"] == path) / 3)
        # paired: the median of the rounds' reference / fused, not a ratio of the paths' medians
        paired = sorted(seconds[s, "reference"][c] / seconds[s, "fused"][c] for s in (1, 2, 3))
        assert report["speedup"][c] == pytest.approx(paired[1])
        assert report["speedup_p20"][c] <= report["speedup"][c] <= report["speedup_p80"][c]
    printed = capsys.readouterr()
    assert "load average (1/5/15 min)" in printed.out and "[bench step]" not in printed.out
    assert "[bench step] step 3" in printed.err  # progress lines on stderr
    lines = printed.out.strip().splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("phase")) :]
    assert table[0].split()[:7] == ["phase", "path", "p50", "s", "p20", "s", "p80"]
    assert [line.split()[:2] for line in table[1:]] == [[c, p] for c in COLUMNS for p in bench_step.PATHS]
    assert table[-2].split()[7] == f"{report['speedup']['total']:.2f}x"  # total, fused
    assert table[-1].split()[7:] == ["1.00x", "[1.00,", "1.00]"]


def test_cli_rejects_a_fixed_key_and_no_rounds():
    with pytest.raises(SystemExit, match="grpo.kl_type"):
        bench_main(["step", "--config", str(CONFIG), *TINY, "grpo.kl_type=gaussian"])
    with pytest.raises(SystemExit, match="steps: got 0"):
        bench_main(["step", "--config", str(CONFIG), "--steps", "0", *TINY])
