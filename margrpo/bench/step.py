"""Benchmark of one GRPO step split by phase (rollout, reward, train): the library's fused path against
the reference code's way, for a trainer config (shapes-tiny: the TinyMAR checkpoint on CPU), in one run.

    margrpo bench step --config configs/shapes-tiny.yaml [--steps N] [--json FILE] [key=value ...]

Both paths run the config's model, sampler, prompts x group (drawn from the ShapesWorld train split),
seeds, mask schedule, CFG, K seed trajectories, recorded steps (the trainer's plan of each step), reward
and optimizer settings, with the reference code's algorithm: REINFORCE, an unguided likelihood over the
positions unknown before each recorded mask step, one update per recorded mask step, a k3 KL term
(fused: on the Gaussian means, parity_mean_k3; reference: on the log-probs; the same work).
  fused      Trainer.train_step (its time/rollout, time/reward, time/train metrics; train covers
             advantages, selection, the reference likelihood, the policy likelihood, backward and the
             optimizer updates)
  reference  margrpo.bench.models.nova_reference_rollout (at every mask step the head denoises ALL N
             tokens, one eager chain per trajectory) and nova_reference_update (the likelihood
             re-evaluates all N tokens per recorded step and trajectory), each phase timed here
Each path trains its own copy of the policy with its own AdamW; the frozen KL reference is shared.
One warm-up step per path on a short schedule, then --steps rounds of one step of each path (both on
the round's prompts), in a shuffled order per round that the report records (margrpo.bench.timing), so
a change of machine load hits both. Per phase and in total: p20 / p50 / p80, min and mean seconds over
the rounds, and the speedup of fused over reference as the median [p20, p80] of the per-round paired
ratios reference / fused. On CUDA the trainer's phase times are host wall times. No memory column: a
step's memory would need one more step per path (the warm-up runs a shorter schedule).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from margrpo.bench.machine import header, machine_description
from margrpo.bench.models import nova_reference_rollout, nova_reference_update
from margrpo.bench.timing import Interleaved, interleave
from margrpo.rollout import effective_steps, mask_schedule
from margrpo.train.config import TrainerConfig, load_config
from margrpo.train.step import record_plan, step_prompts
from margrpo.train.trainer import Trainer

PATHS = ("fused", "reference")
PHASES = ("rollout", "reward", "train")
# The reference code's algorithm, forced on the fused path so both paths do the same kind of update
# (grpo.minibatches = rollout.record_mask_steps is added once the config is read).
PARITY_OVERRIDES = {
    "grpo.objective": "reinforce",
    "grpo.likelihood_cfg": "none",
    "grpo.minibatch_over": "mask_steps",
    "grpo.kl_type": "parity_mean_k3",
    "rollout.likelihood_positions": "unknown",
    "grpo.group_noise": "independent",  # the reference draws every sample's noise on its own
}
FIXED_KEYS = (*PARITY_OVERRIDES, "grpo.minibatches")


def load_bench_config(path: str | Path | None, overrides: list[str] = ()) -> TrainerConfig:
    """The trainer config of `path` + `overrides` with the reference code's algorithm switched on.
    An override of one of the switches the benchmark fixes is an error naming it."""
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        if key in FIXED_KEYS:
            raise ValueError(
                f"override {text!r}: the step benchmark fixes {key} (the reference code's algorithm: "
                f"{', '.join(f'{k}={v}' for k, v in PARITY_OVERRIDES.items())}, grpo.minibatches="
                "rollout.record_mask_steps); expected overrides of other keys"
            )
    parity = [f"{k}={v}" for k, v in PARITY_OVERRIDES.items()]
    config = load_config(path, [*overrides, *parity])
    return load_config(path, [*overrides, *parity, f"grpo.minibatches={config.rollout.record_mask_steps}"])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepBench:
    """Both paths over one trainer: `fused(step)` and `reference(step)` each run one GRPO step on the
    trainer's prompts, seeds and plan of `step` and return ({phase: seconds}, images, rewards)."""

    def __init__(self, config: TrainerConfig):
        if config.grpo.lora.rank:
            raise ValueError(f"grpo.lora.rank: got {config.grpo.lora.rank}, expected 0 (the reference path trains the full policy)")
        self.trainer = Trainer(config, create_run_dir=False)
        torch.set_num_threads(1)  # after the trainer, which applies run.threads
        self.device = self.trainer.device
        self.policy = copy.deepcopy(self.trainer.policy)  # the reference path's own policy (head frozen alike)
        o = config.optim
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # the fused path's (images, rewards)
        reward = self.trainer.reward

        def recording_reward(images, prompts, metadata=None):
            result = reward(images, prompts, metadata)
            self._last = (images, result.total)
            return result

        self.trainer.reward = recording_reward
        self.reward = reward

    def fused(self, step: int) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
        """One Trainer.train_step; its phase times, the images it rewarded and their rewards."""
        self.trainer.step = step  # selects the step's prompts, seeds and plan
        metrics = self.trainer.train_step()
        if "skipped" in metrics:
            raise RuntimeError(f"fused step {step}: the trainer skipped the update (non-finite {metrics['skipped']})")
        times = {phase: metrics[f"time/{phase}"] for phase in PHASES}
        return (times, *self._last)

    def reference(self, step: int) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
        """One reference-style step on this bench's own policy copy, each phase timed."""
        t, config = self.trainer, self.trainer.config
        times = {}
        begin = time.perf_counter()
        prompts, seeds, _ = step_prompts(t, step)
        generator = torch.Generator(device=self.device).manual_seed(seeds[0])
        self.policy.eval()
        images, records = nova_reference_rollout(self.policy, prompts, config.rollout, t.sampler, record_plan(t, step), generator)
        _sync(self.device)
        times["rollout"] = time.perf_counter() - begin

        begin = time.perf_counter()
        rewards = self.reward(images, prompts).total.float().to(self.device)
        times["reward"] = time.perf_counter() - begin

        begin = time.perf_counter()
        self.policy.train()
        if t.ref_policy is not None:
            t.ref_policy.train(self.policy.training)  # the same forward mode, as the trainer does
        g = config.grpo
        nova_reference_update(
            self.policy, t.ref_policy, self.optimizer, prompts, records, t.sampler, rewards, g.group_size, g.kl_beta, config.optim.grad_clip
        )
        _sync(self.device)
        times["train"] = time.perf_counter() - begin
        return times, images, rewards

    def warm_up(self) -> None:
        """One step of each path on a short schedule (4 mask steps, 2 recorded, one prompt x group):
        first-call costs (backend picks, allocations) without a full step's time."""
        full = self.trainer.config
        rollout = dataclasses.replace(
            full.rollout, num_mask_steps=min(4, full.rollout.num_mask_steps), record_mask_steps=min(2, full.rollout.record_mask_steps)
        )
        grpo = dataclasses.replace(full.grpo, prompts_per_step=1, minibatches=rollout.record_mask_steps)
        self.trainer.config = dataclasses.replace(full, rollout=rollout, grpo=grpo)
        try:
            self.fused(0)
            self.reference(0)
        finally:
            self.trainer.config = full

    def settings(self) -> dict[str, object]:
        """The sizes and switches both paths ran with (for the report)."""
        config, policy = self.trainer.config, self.trainer.policy
        r, g = config.rollout, config.grpo
        counts = mask_schedule(policy.num_tokens, r.num_mask_steps, r.schedule)
        return {
            "checkpoint": config.backbone.checkpoint,
            "prompts_per_step": g.prompts_per_step,
            "group_size": g.group_size,
            "images": g.prompts_per_step * g.group_size,
            "tokens": policy.num_tokens,
            "token_channels": policy.token_channels,
            "mask_steps": r.num_mask_steps,
            "effective_mask_steps": len(effective_steps(counts)),
            "diffusion_steps": self.trainer.sampler.num_steps,
            "num_seeds": r.num_seeds,
            "cfg_scale": r.cfg_scale,
            "record_mask_steps": r.record_mask_steps,
            "record_diffusion_steps": r.record_diffusion_steps,
            "mte": g.mte,
            "mte_ratio": g.mte_ratio,
            "consistency": g.consistency,
            "kl_beta": g.kl_beta,
            "lr": config.optim.lr,
            "algorithm": {**PARITY_OVERRIDES, "grpo.minibatches": g.minibatches},
            "torch_threads": torch.get_num_threads(),
        }


def run(config: TrainerConfig, steps: int, log=print) -> tuple[dict, dict[str, torch.Tensor]]:
    """Warm up each path once (short schedule), then `steps` interleaved rounds of one step of each
    path -> (report, the last images of each path). report: machine (with load averages before and
    after), settings, per-step rows in the order run, the order of every round, per path and phase
    the percentiles and the mean seconds, and the speedup (reference / fused, paired per round: median,
    p20, p80) per phase and in total."""
    if steps < 1:
        raise ValueError(f"steps: got {steps}, expected >= 1 timed rounds")
    load_before = os.getloadavg()
    bench = StepBench(config)
    bench.warm_up()
    functions = {"fused": bench.fused, "reference": bench.reference}
    rows, images, done = [], {}, dict.fromkeys(PATHS, 0)

    def one_step(path: str) -> None:
        done[path] += 1  # a path's k-th call is round k: both paths of a round run the same step
        times, images[path], rewards = functions[path](done[path])
        row = {"step": done[path], "path": path, **times, "total": sum(times.values()), "reward_mean": float(rewards.float().mean())}
        rows.append(row)
        phases = "  ".join(f"{k} {row[k]:.2f}s" for k in (*PHASES, "total"))
        log(f"[bench step] step {row['step']} {path:<9} {phases}  reward {row['reward_mean']:.3f}")

    order = interleave(
        {path: lambda path=path: one_step(path) for path in PATHS},
        bench.device,
        min_time_s=0.0,
        warmup=0,
        min_rounds=steps,
        max_rounds=steps,
    ).order
    columns = (*PHASES, "total")
    # per column, the paths' seconds round by round (the trainer's phase times, not the call's wall time)
    by_round = {
        c: Interleaved({p: [r[c] for r in sorted(rows, key=lambda r: r["step"]) if r["path"] == p] for p in PATHS}, order) for c in columns
    }
    stats = {path: {c: by_round[c].stats(path) for c in columns} for path in PATHS}
    ratios = {c: by_round[c].ratio("reference", "fused") for c in columns}
    machine = {
        **machine_description(bench.device),
        "load_average": [round(v, 2) for v in load_before],
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
    }
    report = {
        "machine": machine,
        "settings": bench.settings(),
        "steps": steps,
        "rows": rows,
        "order": order,
        "mean_s": {path: {c: sum(by_round[c].times[path]) / steps for c in columns} for path in PATHS},
        "stats_s": {
            path: {c: {k: getattr(st, k) for k in ("p20", "p50", "p80", "min")} for c, st in per.items()} for path, per in stats.items()
        },
        "speedup": {c: r.p50 for c, r in ratios.items()},
        "speedup_p20": {c: r.p20 for c, r in ratios.items()},
        "speedup_p80": {c: r.p80 for c, r in ratios.items()},
    }
    return report, images


def format_table(report: dict) -> str:
    """One line per phase (and the total) and path: seconds p50, p20, p80, min and mean, and the
    speedup of fused over reference, paired per round (the reference's own line: 1.00x)."""
    lines = [f"{'phase':<8} {'path':<10} {'p50 s':>9} {'p20 s':>9} {'p80 s':>9} {'min s':>9} {'mean s':>9} {'speedup p50 [p20, p80]':>24}"]
    for c in (*PHASES, "total"):
        for path in PATHS:
            st = report["stats_s"][path][c]
            speed = (
                f"{report['speedup'][c]:.2f}x [{report['speedup_p20'][c]:.2f}, {report['speedup_p80'][c]:.2f}]"
                if path == "fused"
                else "1.00x [1.00, 1.00]"
            )
            lines.append(
                f"{c:<8} {path:<10} {st['p50']:>9.3f} {st['p20']:>9.3f} {st['p80']:>9.3f} {st['min']:>9.3f} "
                f"{report['mean_s'][path][c]:>9.3f} {speed:>24}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo bench step", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="trainer YAML (e.g. configs/shapes-tiny.yaml)")
    parser.add_argument("--steps", type=int, default=2, help="timed rounds after the warm-up (default: 2)")
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (not the fixed algorithm keys)")
    args = parser.parse_args(argv)
    try:
        config = load_bench_config(args.config, args.overrides)
        report, _ = run(config, args.steps, log=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as error:
        raise SystemExit(f"margrpo bench step: {error}") from None
    report["command"] = " ".join(["margrpo bench step --config", args.config, f"--steps {args.steps}", *args.overrides])
    machine = report["machine"]
    print(header(machine))
    print(
        f"load average (1 min) {machine['load_average_before'][0]:.2f} -> {machine['load_average_after'][0]:.2f} "
        f"over the run, {args.steps} rounds"
    )
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
