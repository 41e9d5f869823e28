"""The MAR-GRPO trainer: rollout -> rewards -> advantages -> token selection -> clipped likelihood-ratio
updates with a KL to a frozen ref policy. This module is the run's lifecycle: setup, checkpoint/resume,
logging, evaluation, the loop, torchrun (DDP or FSDP2, margrpo.train.distributed); one step is
margrpo.train.step. The ref policy is a frozen copy of the starting policy (refreshed to the current
policy every grpo.ref_refresh_every steps), or, when only LoRA adapters train (grpo.lora), the policy
itself with its adapters disabled. run.ema_decay keeps an EMA of the trainable weights.

    margrpo train --config configs/shapes-tiny.yaml [key=value ...]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import signal
import sys
from pathlib import Path

import torch
import yaml

from margrpo.config import ConfigFileNotFoundError, to_dict
from margrpo.grpo import Collectives
from margrpo.grpo import advantages as adv_mod
from margrpo.models import load_backbone, resolve_device
from margrpo.models.base import check_backbone

from . import checkpoint as ckpt
from . import step as step_mod
from . import distributed as dist_utils
from . import lora as lora_utils
from .config import ConfigError, TrainerConfig, load_config, reward_weight_notes
from .evaluate import generate_images, verifier_summary
from .metrics import MetricsLogger, plot_curves


class _EMA:
    """An exponential moving average of the policy's trainable parameters (run.ema_decay), held as
    tensors shaped like the parameters (their local shards under FSDP2)."""

    def __init__(self, policy: torch.nn.Module, decay: float) -> None:
        self.policy = policy
        self.decay = decay
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        for param, average in zip(self.params, self.shadow):
            average.lerp_(param.detach(), 1 - self.decay)  # decay * average + (1 - decay) * param

    @contextlib.contextmanager
    def swapped_in(self):
        """The policy holds the EMA weights inside the context, its own again after (exact copies)."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def _swap(self) -> None:
        for param, average in zip(self.params, self.shadow):
            held = param.detach().clone()
            param.copy_(average)
            average.copy_(held)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The EMA by parameter name, full tensors on the CPU (a collective under FSDP2, like trainable_state)."""
        with self.swapped_in():
            return {n: t.detach().to("cpu", copy=True) for n, t in dist_utils.full_state_dict(self.policy).items()}

    def load_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        with self.swapped_in():  # loaded into the policy's place, which the swap back hands to the EMA
            dist_utils.load_full_state_dict(self.policy, weights)


class Trainer:
    def __init__(self, config: TrainerConfig, create_run_dir: bool = True, policy=None, evaluation_only: bool = False):
        """policy: a backbone already in memory (e.g. a random-init benchmark model) instead of the one
        config.backbone loads. evaluation_only (margrpo eval): run.train_prompts is neither read nor
        checked; the held-out prompts stand in for them."""
        self.config = config
        run = config.run
        if run.threads:
            torch.set_num_threads(run.threads)
        self.rank, self.world = dist_utils.init()
        self.device = dist_utils.device_for_rank(resolve_device(run.device), self.rank)
        torch.manual_seed(run.seed + self.rank)
        self.out_dir = Path(run.out_dir)
        self.is_main = self.rank == 0

        self.policy = load_backbone(config.backbone, self.device) if policy is None else check_backbone(policy, "policy")
        try:
            self.sampler = self.policy.make_sampler(config.backbone.diffusion_steps)
        except ValueError as err:  # more steps than the model's chain has: known only with the model
            raise ConfigError(f"backbone.diffusion_steps: {err}") from err
        self._check_recordable(evaluation_only)
        if config.rollout.num_seeds and not config.grpo.mte and self.is_main:
            print(
                f"[margrpo] warning: rollout.num_seeds is {config.rollout.num_seeds} but grpo.mte is false: the rollout "
                "samples the seed trajectories and nothing reads them (the update scores trajectory 0 only); set "
                "rollout.num_seeds: 0 to save that work (the samples then change: the noise bank has one trajectory)",
                file=sys.stderr,
            )
        self._configure_trainable()
        self.ref_policy = None  # a frozen copy of the starting policy, when the KL needs one
        if config.grpo.kl_beta > 0 and not config.grpo.lora.rank:
            # (with LoRA the ref policy is the policy with its adapters disabled: no copy)
            self.ref_policy = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.sharded = run.parallel == "fsdp2" and dist_utils.active()
        if self.sharded:  # after the ref policy copy (which stays whole) and before the optimizer
            dist_utils.shard_fsdp2(self.policy, self.device)
        self.ema = _EMA(self.policy, run.ema_decay) if run.ema_decay else None  # after sharding: shaped like the shards
        # one process: the defaults (no collective calls in the step); torchrun: torch.distributed's
        self.collectives = Collectives()
        if dist_utils.active():
            self.collectives = Collectives(
                all_ranks=dist_utils.all_ranks,
                clip_grad_norm=dist_utils.clip_grad_norm,
                mean=dist_utils.mean,
                all_gather_cat=dist_utils.all_gather_cat,
                all_gather_objects=dist_utils.all_gather_objects,
                # FSDP2 reduce-scatters the gradients in backward already
                reduce_gradients=(lambda module: None) if self.sharded else dist_utils.average_gradients,
            )
        self.reward = self._build_reward()
        (self.train_prompts, self.train_metadata), (self.eval_prompts, self.eval_metadata) = self._load_prompts(evaluation_only)
        self._check_metadata(evaluation_only)
        self.flat_steps = {term.name: 0 for term in self.reward.terms}  # steps in a row without within-group variance
        self.prompt_groups = self._prompt_groups()
        self.optimizer, self.scheduler = self._build_optimizer()
        self.tracker = adv_mod.PromptTracker(eps=config.grpo.advantage_eps) if config.grpo.advantage == "tracker" else None
        self.step = 0
        self.bad_steps = 0
        self.skipped_total = 0
        self._stop_signal: int | None = None
        self.logger = None
        if create_run_dir:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if run.resume == "auto":
                self._resume()
            if self.is_main:  # after the resume, which may refuse this config
                (self.out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
                # the log continues from the checkpoint: a resumed run logs from its step + 1, a new one from 0
                self.logger = MetricsLogger(
                    self.out_dir, run.tensorboard, run.wandb, to_dict(config), start_step=self.step + 1 if self.step else 0
                )

    @classmethod
    def from_files(cls, path, overrides=(), create_run_dir: bool = True) -> "Trainer":
        return cls(load_config(path, list(overrides)), create_run_dir=create_run_dir)

    # ------------------------------------------------------------------ setup
    def _configure_trainable(self) -> None:
        g = self.config.grpo
        self.policy.requires_grad_(False)
        if g.lora.rank:  # LoRA adapters only (the config requires a frozen head)
            # the global RNG is seeded per rank; the adapters' random init must be the same on every
            # rank (and in one process), so it draws from the run seed (peft initialises on the CPU)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.config.run.seed)
                trainable = lora_utils.apply_lora(self.policy, g.lora.rank, g.lora.alpha, g.lora.dropout, g.lora.targets)
        else:
            trainable = self.policy.trainable_parameters()
        for p in trainable:
            p.requires_grad_(True)
        # frozen head: no parameter updates, but gradients still flow through it into z
        self.policy.head.requires_grad_(g.head != "frozen")

    def _build_optimizer(self):
        o = self.config.optim
        head_ids = {id(p) for p in self.policy.head.parameters()}
        body = [p for p in self.policy.parameters() if p.requires_grad and id(p) not in head_ids]
        groups = [{"params": body, "lr": o.lr}]
        if self.config.grpo.head != "frozen":
            scale = self.config.grpo.head_lr_scale if self.config.grpo.head == "low_lr" else 1.0
            groups.append({"params": list(self.policy.head.parameters()), "lr": o.lr * scale})
        optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        total = max(1, self.config.run.steps)

        def factor(step: int) -> float:
            if o.warmup_steps and step < o.warmup_steps:
                return (step + 1) / o.warmup_steps
            if o.schedule == "cosine":
                progress = (step - o.warmup_steps) / max(1, total - o.warmup_steps)
                return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
            return 1.0

        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def _check_recordable(self, evaluation_only: bool = False) -> None:
        """The recorded steps must exist in this model's schedule and sampler: known only now, with
        the model loaded, and checked before any work. Training needs at least one (a config that
        records none still samples and evaluates)."""
        recorded = self.config.rollout.record_mask_steps
        if recorded < 1 and not evaluation_only:
            raise ConfigError(
                f"rollout.record_mask_steps: got {recorded}, expected >= 1 to train (the update trains on the recorded mask "
                "steps; 0 records nothing, which only sampling and evaluation accept)"
            )
        steps, tokens = self.config.rollout.num_mask_steps, self.policy.num_tokens
        if steps > tokens:  # before the schedule, whose cost grows with the steps whatever the tokens
            raise ConfigError(
                f"rollout.num_mask_steps: got {steps}, expected at most the model's {tokens} tokens (a step beyond them reveals nothing)"
            )
        try:
            step_mod.record_plan(self, 0)
        except ValueError as err:  # choose_plan names the rollout key
            raise ConfigError(f"rollout.{err}") from err

    def _build_reward(self):
        from margrpo.rewards import build_rewards

        if self.is_main:
            for note in reward_weight_notes(self.config.rewards):
                print(f"[margrpo] warning: {note}", file=sys.stderr)
        try:
            return build_rewards(self.config.rewards)
        except (KeyError, TypeError, ValueError) as err:  # an unknown reward or option: a config error
            raise ConfigError(f"rewards: {err.args[0] if isinstance(err, KeyError) else err}") from err

    def _load_prompts(self, evaluation_only: bool = False):
        """((train prompts, their metadata), (held-out prompts, their metadata)); metadata None when
        the prompts carry none (plain-text files, the ShapesWorld splits). evaluation_only: the held-out
        ones twice."""
        from margrpo.prompt_files import PromptFileError, prompts_and_metadata, read_prompt_records
        from margrpo.testbed.splits import balanced_prompts, load_prompts

        run = self.config.run

        def read(key: str, path: str):
            if not Path(path).is_file():
                raise ConfigFileNotFoundError(f"run.{key}: prompt file not found: {path}")
            try:
                records = read_prompt_records(path)
            except PromptFileError as err:
                raise ConfigError(f"run.{key}: {err}") from err
            if not records:
                raise ConfigError(f"run.{key}: {path} holds no prompt (expected one per non-empty line)")
            return prompts_and_metadata(records)

        heldout = read("eval_prompts", run.eval_prompts) if run.eval_prompts else (balanced_prompts("heldout", run.eval_per_category), None)
        if evaluation_only:
            return heldout, heldout
        train = read("train_prompts", run.train_prompts) if run.train_prompts else (load_prompts("train"), None)
        return train, heldout

    def _check_metadata(self, evaluation_only: bool = False) -> None:
        """A reward that scores from per-prompt metadata needs prompts that carry it: said before any work
        (evaluation_only: the held-out prompts only)."""
        needing = [t.name for t in self.reward.terms if getattr(t.reward, "needs_metadata", False)]
        if not needing:
            return
        # the held-out evaluation scores with the rewards unless the ShapesWorld verifier does it
        files = [] if evaluation_only else [("train_prompts", self.train_metadata)]
        if "shapes" not in self.config.rewards:
            files.append(("eval_prompts", self.eval_metadata))
        for key, metadata in files:
            if metadata is None:
                raise ConfigError(
                    f"run.{key}: reward(s) {', '.join(needing)} score the objects, counts and relations named in "
                    f"per-prompt metadata, and {getattr(self.config.run, key) or 'the ShapesWorld split'} carries "
                    "none; give a .jsonl prompt file with 'objects' (and 'position') per prompt (docs/USING.md)"
                )

    def _prompt_groups(self) -> list[list[int]]:
        """Indices of the train prompts, one list per group a step draws from uniformly (run.train_prompt_mix)."""
        if self.config.run.train_prompt_mix == "uniform":
            return [list(range(len(self.train_prompts)))]
        from margrpo.testbed.grammar import parse_prompt

        by_category: dict[str, list[int]] = {}
        for i, prompt in enumerate(self.train_prompts):
            try:
                category = parse_prompt(prompt).category
            except ValueError as error:
                raise ConfigError(
                    f"run.train_prompt_mix: category needs ShapesWorld prompts; {prompt!r} does not parse ({error})"
                ) from error
            by_category.setdefault(category, []).append(i)
        return list(by_category.values())

    # ------------------------------------------------------------------ one step: margrpo.train.step
    # its functions take the trainer as their first argument, so they serve as methods as they stand
    train_step = step_mod.train_step
    rollout = step_mod.step_rollout
    step_metadata = step_mod.step_metadata

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, step: int, log: bool = True, grid_name: str | None = None) -> dict[str, float]:
        run = self.config.run
        self.policy.eval()
        with self.ema.swapped_in() if run.eval_ema else contextlib.nullcontext():
            prompts, images = generate_images(
                self.policy, self.sampler, self.config.rollout, self.eval_prompts, run.eval_samples_per_prompt, run.eval_seed
            )
        if "shapes" in self.config.rewards:
            summary = verifier_summary(images, prompts)
        else:
            metadata = (
                None if self.eval_metadata is None else [m for m in self.eval_metadata for _ in range(run.eval_samples_per_prompt)]
            )  # as generate_images repeats
            summary = {"reward": self.reward(images, prompts, metadata).total.mean().item()}
        summary = {f"heldout/{k}": v for k, v in summary.items()}
        if log and self.logger is not None:
            self.logger.log("eval", step, summary)
        if grid_name and self.is_main:
            from margrpo.train.grid import save_grid

            save_grid(images, prompts, self.out_dir / grid_name, columns=run.eval_samples_per_prompt * 4)
        return summary

    # ------------------------------------------------------------------ checkpoints
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trainable parameters by name, full tensors (under FSDP2 a collective: every rank calls
        it, rank 0 gets the gathered tensors, the others an empty dict)."""
        return dist_utils.full_state_dict(self.policy)

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint from rank 0 (every rank calls it: under FSDP2 the full state is gathered)."""
        weights = self.trainable_state()
        optimizer = dist_utils.full_optimizer_state(self.policy, self.optimizer)
        ema = None if self.ema is None else self.ema.state_dict()
        if not self.is_main:
            return None
        state = {
            "step": self.step,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "rng": ckpt.rng_state(),
            "tracker": None if self.tracker is None else self.tracker.state_dict(),
            "bad_steps": self.bad_steps,
            "skipped_total": self.skipped_total,
            "ema": ema,
            "ref_policy": self._refreshed_ref_policy(),
            "config": yaml.safe_dump(to_dict(self.config), sort_keys=False),
            "world": self.world,  # what a resume must match
        }
        return ckpt.save(self.out_dir / "checkpoints", self.step, weights, state, self.config.run.keep_last)

    def _refreshed_ref_policy(self) -> dict[str, torch.Tensor] | None:
        """The ref policy's trainable weights when refreshes may have moved them off the starting policy."""
        if not self.config.grpo.ref_refresh_every:
            return None
        trainable = {n for n, p in self.policy.named_parameters() if p.requires_grad}
        return {n: p.detach().to("cpu", copy=True) for n, p in self.ref_policy.named_parameters() if n in trainable}

    def _resume(self) -> None:
        """Load the run's newest valid checkpoint, after finishing what a killed process left."""
        root = self.out_dir / "checkpoints"
        if self.is_main:
            for line in ckpt.recover(root):
                print(f"[margrpo] {root}: {line}", file=sys.stderr)
        dist_utils.all_ranks(True)  # the other ranks list the checkpoints once rank 0 has recovered them
        latest = ckpt.latest(root)
        if latest is not None:
            self.load_checkpoint(latest)

    def load_checkpoint(self, path, weights_only: bool = False) -> None:
        """Restore a checkpoint: the trainable weights and, unless weights_only, the training state,
        which must come from the same settings (check_resume_config)."""
        weights, state = ckpt.load(path)
        if not weights_only and "config" in state:
            changed = check_resume_config(yaml.safe_load(state["config"]), state["world"], to_dict(self.config), self.world, path)
        else:
            changed = []
        own = dict(self.policy.named_parameters())
        unknown = sorted(set(weights) - set(own))
        if unknown:
            raise ckpt.CorruptCheckpointError(f"{path}: parameters not in this model: {unknown[:5]}")
        dist_utils.load_full_state_dict(self.policy, weights)
        if self.ema is not None:  # a checkpoint written without one (margrpo eval --checkpoint) starts it at its weights
            self.ema.load_state_dict(state.get("ema") or weights)
        if weights_only:
            return
        try:
            dist_utils.load_optimizer_state(self.policy, self.optimizer, state["optimizer"])
        except (KeyError, ValueError) as err:  # a checkpoint of other trainable parameters (grpo.head, lora)
            raise ConfigError(
                f"{path}: its optimizer state does not fit this config's trainable parameters "
                f"({err}); resume with the settings it was written with"
            ) from err
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        if self.tracker is not None and state.get("tracker"):
            self.tracker.load_state_dict(state["tracker"])
        refreshed = state.get("ref_policy", state.get("reference"))  # "reference": checkpoints before 2026-12
        if refreshed is not None:
            own = dict(self.ref_policy.named_parameters())
            with torch.no_grad():
                for name, value in refreshed.items():
                    own[name].copy_(value)
        self.step = state["step"]
        self.bad_steps, self.skipped_total = state.get("bad_steps", 0), state.get("skipped_total", 0)
        if self.is_main:
            print(f"[margrpo] resumed from {path} at step {self.step}" + (f" ({'; '.join(changed)})" if changed else ""))

    # ------------------------------------------------------------------ the loop
    @property
    def stop_signal(self) -> int | None:
        """The signal that stopped run() early (after saving a checkpoint), or None."""
        return self._stop_signal

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def run(self) -> dict[str, dict[str, float]]:
        run = self.config.run
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        results = {}
        try:
            if self.step == 0:
                results["before"] = self.evaluate(0, grid_name="samples_before.png")
            progress = _progress(run.steps, self.step, self.is_main)
            while self.step < run.steps:
                metrics = self.train_step()
                self.step += 1
                if self.logger is not None and self.step % run.log_every == 0:
                    self.logger.log("train", self.step, metrics)
                progress.update(1)
                progress.set_postfix(_postfix(metrics))
                if run.eval_every and self.step % run.eval_every == 0 and self.step < run.steps:
                    self.evaluate(self.step)
                # a signal on any rank stops every rank (saving is a collective under FSDP2)
                if not dist_utils.all_ranks(self._stop_signal is None):
                    self.save_checkpoint()
                    print(f"[margrpo] signal {self._stop_signal}: checkpoint saved at step {self.step}; exiting")
                    return results
                if run.save_every and self.step % run.save_every == 0:
                    self.save_checkpoint()
            progress.close()
            results["after"] = self.evaluate(self.step, grid_name="samples_after.png")
            self.save_checkpoint()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self.logger is not None:
                self.logger.close()
        if self.is_main:
            plot_curves(self.out_dir / "metrics.jsonl", self.out_dir / "reward_curve.png")
        return results


# keys a resumed run may change: they set how long it runs, where and how it reports, not what it
# trains (run.steps also rescales a cosine schedule over the new length)
RESUME_OVERRIDES = (
    "run.steps",
    "run.out_dir",
    "run.device",
    "run.threads",
    "run.parallel",
    "run.save_every",
    "run.keep_last",
    "run.eval_every",
    "run.log_every",
    "run.tensorboard",
    "run.wandb",
    "run.max_bad_steps",
    "run.resume",
    "run.eval_ema",
    "run.flat_reward_warn_steps",
    "rollout.cuda_graph",  # how the head runs, not what it computes
    "rollout.compile_head",
    "pretrain",
)
GLOBAL_BATCH = "grpo.prompts_per_step"  # per rank: a resume compares it times the world size


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict) and tree:
        return {k: v for key, value in tree.items() for k, v in _flatten(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def check_resume_config(saved: dict, saved_world: int, current: dict, world: int, path) -> list[str]:
    """Raise ConfigError naming every key that differs between a checkpoint's config (written by
    saved_world ranks) and this one, except RESUME_OVERRIDES; returns those as 'key: old -> new'.
    The prompts per step compare over all ranks (2 ranks x 4 prompts resume as 1 x 8)."""
    current = yaml.safe_load(yaml.safe_dump(current))  # the saved form (tuples as lists)
    old, new = _flatten(saved), _flatten(current)
    old[GLOBAL_BATCH] *= saved_world
    new[GLOBAL_BATCH] *= world
    # a setting newer than the checkpoint (absent from its config) at its default is what that run did
    defaults = _flatten(yaml.safe_load(yaml.safe_dump(to_dict(TrainerConfig()))))
    for key in new.keys() - old.keys():
        if key in defaults and new[key] == defaults[key]:
            old[key] = new[key]
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>"))

    def allowed(key: str) -> bool:
        return any(key == a or key.startswith(a + ".") for a in RESUME_OVERRIDES)

    def describe(key: str) -> str:
        name = f"{key} x ranks" if key == GLOBAL_BATCH else key
        return f"{name}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"

    refused = [describe(k) for k in changed if not allowed(k)]
    if refused:
        raise ConfigError(
            f"run.resume: {path} was written with other settings: {'; '.join(refused)}. A resumed run keeps its "
            f"settings except {', '.join(RESUME_OVERRIDES)}; restore them, or start a new run "
            "(another run.out_dir, or run.resume=never)"
        )
    return [describe(k) for k in changed]


def _progress(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc="grpo", dynamic_ncols=True)


def _postfix(metrics: dict) -> dict:
    keys = {"reward_mean": "reward", "kl": "kl", "clip_fraction": "clip", "images_per_s": "img/s"}
    return {short: f"{metrics[k]:.3g}" for k, short in keys.items() if isinstance(metrics.get(k), float)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo train", description="MAR-GRPO training")
    parser.add_argument("--config", required=True, help="YAML config (e.g. configs/shapes-tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. grpo.kl_beta=0.02")
    args = parser.parse_args(argv)
    trainer = Trainer.from_files(args.config, args.overrides)
    results = trainer.run()
    if trainer.is_main and "after" in results:
        out = trainer.out_dir
        before, after = results.get("before"), results["after"]
        print("\nheld-out verifier reward (fixed seeds):")
        for key in after:
            was = f"{before[key]:.3f} -> " if before and key in before else ""
            print(f"  {key:<22} {was}{after[key]:.3f}")
        print(f"reward curve: {out / 'reward_curve.png'}")
        print(f"samples: {out / 'samples_before.png'} (before), {out / 'samples_after.png'} (after)")
        print(f"metrics: {out / 'metrics.jsonl'}; checkpoints: {out / 'checkpoints'}")
        (out / "summary.json").write_text(json.dumps(results, indent=1))
    dist_utils.shutdown()
    # stopped by SIGTERM/SIGINT (checkpoint saved): the shell's 128 + signal, so a scheduler can tell
    return 0 if trainer.stop_signal is None else 128 + trainer.stop_signal
