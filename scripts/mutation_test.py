#!/usr/bin/env python
"""Mutation testing of margrpo's GRPO, selection, rollout, trainer and op-oracle code (issues 19, 30).

Every entry of MUTANTS is a realistic one-line bug: where it goes (`path::function`, the function
that holds it: `Class.method`, nested `outer.inner`; just the path for module level), a one-line
piece of text that must occur exactly once inside that function, what replaces it, and the tests
that cover that code. Anchoring by function keeps an entry valid while its neighbours change; the
list is checked against the tree here, before anything runs (and by `--check`), not in CI.

For each mutant the script copies the tree (the files git lists, plus the built extension
margrpo/_C*.so; with --commit REV, the files of that commit) into a temporary directory, applies
the mutant there (the working tree is never edited), and runs the mutant's tests with
`pytest -x -q -p no:cacheprovider` (PYTEST_ARGS) in that copy under a timeout. pytest imports the
copy's margrpo through a package link: PYTHONPATH holds a directory with only `margrpo` in it, a
link to the copy's package (the kernels/ sources linked into margrpo.kernels, as a wheel has them).
The copy's root is never on the path: tests/conftest.py removes it, and the editable install would
then serve the checkout's unmutated margrpo (which is how the 2026-12-04 run went wrong).

  caught    the tests fail (pytest exit code 1, or 2 for an error while collecting)
  survived  the tests pass: no test notices the bug
  timeout   the tests ran past --timeout seconds
  error     anything else (no test collected, a usage error, ...): the entry needs fixing

Before anything else the SENTINEL mutant runs: its only effect is an AssertionError when margrpo is
imported, so it is caught exactly when the mutated copy is what pytest imports; the script stops if
it is not (the run would measure nothing). Then the unmutated copy runs the union of the mutants'
tests the same way (the baseline): a mutant is only caught by tests that pass without it. Mutants
marked `equivalent` (with the reason) cannot change observable behaviour; they run too, but do not
count in the score, which is caught / non-equivalent mutants.

    python scripts/mutation_test.py --list
    python scripts/mutation_test.py --check        # the list against the tree, nothing run
    python scripts/mutation_test.py --only mte_least_uncertain --only k3_no_gradient
    nice -n 19 python scripts/mutation_test.py --out benchmarks/results/DATE-cpu-mutation.md \
        --machine "2-core AMD EPYC x86_64, shared"

Exit status: 0 when every non-equivalent mutant is caught, 1 otherwise, 2 for a broken list, a
sentinel that was not caught or a failing baseline.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import io
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRA_FILES = ("margrpo/_C*.so",)  # built, ignored by git, needed by the ops' cpp backend
PACKAGE = "margrpo"  # what PYTHONPATH links to in a copy (never the copy's root: see the docstring)
# (link, target) in a copy: the top-level kernels/ sources inside margrpo.kernels, as setup.py installs them
# (the package's own path to the checkout's folder does not reach it through the link)
PACKAGE_LINKS = (("margrpo/kernels", "kernels"),)
# no test under tests/ uses hypothesis or pytest-benchmark, whose plugins take seconds to import
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark")


@dataclass(frozen=True)
class Mutant:
    name: str
    location: str  # "path::function" (Class.method, outer.inner), or "path" for module level
    original: str  # one line's text (or part of it) that occurs exactly once inside the location
    replacement: str
    description: str
    tests: tuple[str, ...]  # pytest files or node ids, relative to the repository root
    equivalent: str | None = None  # why the mutant cannot change behaviour (then it is not scored)
    # a control (the sentinel): caught only when the tests fail AND their output holds this text; not scored
    expect_output: str | None = None

    @property
    def path(self) -> str:
        return self.location.partition("::")[0]

    @property
    def function(self) -> str | None:
        return self.location.partition("::")[2] or None


# ------------------------------------------------------------------------------------ test selections
SELECTION = ("tests/test_grpo_selection.py",)
MATH = ("tests/test_grpo_math.py",)
OBJ = "tests/test_grpo_objective.py"
KL_TERM = (f"{OBJ}::test_kl_term_value_and_gradient", f"{OBJ}::test_kl_term_is_a_mean_whatever_the_batch_shape")
WEIGHTS = (
    f"{OBJ}::test_policy_and_kl_weights_follow_their_aggregation",
    f"{OBJ}::test_per_update_normalisation_makes_each_update_sum_to_one",
)
UPDATE = ("tests/test_grpo_update.py", OBJ)
OPTIM = "tests/test_trainer_optim.py"
ROLLOUT = ("tests/test_rollout.py",)
KNOWN_MASK = ("tests/test_rollout_known_mask.py",)
PROPS = PROPS_FILE = "tests/test_grpo_properties.py"
ROLL_PROPS = "tests/test_rollout_properties.py"


def _ops(name: str) -> tuple[str, ...]:
    """An op's tests, on the torch backend (margrpo.ops.oracle) only."""
    return (f"tests/test_ops_{name}.py", "-k", "torch")


GRPO, ROLL, TRAIN, ORACLE = "margrpo/grpo", "margrpo/rollout", "margrpo/train/trainer.py", "margrpo/ops/oracle.py"
STEP = "margrpo/train/step.py"

SENTINEL_MESSAGE = "margrpo-mutation-sentinel: the mutated copy was imported"
# runs first: importing margrpo raises, so its tests fail with this message exactly when pytest imports the
# copy's margrpo; if they pass, no mutant would be seen either, and the script stops
SENTINEL = Mutant(
    "sentinel_import_raises",
    "margrpo/__init__.py",
    "__version__ = ",
    f"raise AssertionError({SENTINEL_MESSAGE!r}); __version__ = ",
    "control: importing margrpo raises (proves the tests import the mutated copy)",
    ("tests/test_grpo_math.py",),
    expect_output=SENTINEL_MESSAGE,
)

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------ the 10 survivors of issue 19's first measurement
    Mutant(
        "mte_least_uncertain",
        f"{GRPO}/selection.py::mte_mask",
        "selected = ops.topk_mask(scores, ratio=ratio, check_finite=False)",
        "selected = ops.topk_mask(-scores, ratio=ratio, check_finite=False)",
        "MTE selects the least uncertain positions",
        SELECTION,
    ),
    Mutant(
        "consistency_and_committed",
        f"{GRPO}/selection.py::consistency_keep",
        "return moved | committed.bool()[..., None]",
        "return moved & committed.bool()[..., None]",
        "consistency keeps moved AND committed instead of OR",
        SELECTION,
    ),
    Mutant(
        "consistency_reversed",
        f"{GRPO}/selection.py::consistency_keep",
        "ops.consistency_mask(prev, cur, fin,",
        "ops.consistency_mask(cur, prev, fin,",
        "consistency keeps positions that moved away from the final latent",
        SELECTION,
    ),
    Mutant(
        "kl_shrunk_by_transitions",
        f"{GRPO}/objective.py::chunk_loss",
        "kl = (per_transition * kl_weights).sum()",
        "kl = (per_transition * kl_weights).mean()",
        "KL term divided once more by the chunk's B*L",
        KL_TERM,
    ),
    Mutant(
        "k3_no_gradient",
        f"{GRPO}/objective.py::chunk_loss",
        "logp=token_logp[0],",
        "logp=token_logp[0].detach(),",
        "k3 KL gets no gradient",
        KL_TERM,
    ),
    Mutant(
        "sample_mean_not_normalised",
        "margrpo/ops/grpo_surrogate.py::token_weights",
        "w / torch.where(kept, per_sample, 1.0), 0.0) / samples_kept",
        "w / torch.where(kept, per_sample, 1.0), 0.0)",
        "sample_mean weights sum to the number of samples, not 1",
        WEIGHTS,
    ),
    Mutant(
        "lr_scheduler_not_stepped",
        f"{STEP}::_rollout_and_update",
        "t.scheduler.step()",
        "pass  # t.scheduler.step()",
        "the LR scheduler is not stepped after an update",
        (f"{OPTIM}::test_lr_schedule_follows_the_step_count_through_skipped_steps",),
    ),
    Mutant(
        "grad_clip_disabled",
        f"{GRPO}/policy_update.py::update",
        "collectives.clip_grad_norm(params, grad_clip)",
        "collectives.clip_grad_norm(params, math.inf)",
        "gradient clipping disabled in update()",
        (f"{OBJ}::test_each_optimizer_step_sees_the_gradient_clipped_to_grad_clip",),
    ),
    Mutant(
        "head_low_lr_ignored",
        f"{TRAIN}::Trainer._build_optimizer",
        'scale = self.config.grpo.head_lr_scale if self.config.grpo.head == "low_lr" else 1.0',
        "scale = 1.0",
        "`head: low_lr` trains the head at the full lr",
        (f"{OPTIM}::test_a_trained_head_gets_its_own_learning_rate",),
    ),
    Mutant(
        "same_noise_every_step",
        f"{STEP}::step_prompts",
        "sample_seed(t.config.run.seed, step, s, i)",
        "sample_seed(t.config.run.seed, 0, s, i)",
        "every training step draws the same noise",
        (f"{OPTIM}::test_every_step_draws_new_noise_and_prompts",),
    ),
    # ------------------------------------------------ advantages
    Mutant(
        "advantage_batch_mean",
        f"{GRPO}/advantages.py::group_advantages",
        "centered = r - r.mean(1, keepdim=True)",
        "centered = r - r.mean()",
        "advantages centred on the batch mean, not the group's",
        MATH,
    ),
    Mutant(
        "advantage_group_std_unbiased",
        f"{GRPO}/advantages.py::group_advantages",
        "r.std(1, unbiased=unbiased, keepdim=True)",
        "r.std(1, unbiased=True, keepdim=True)",
        "group std always unbiased (advantage_std ignored)",
        MATH,
    ),
    Mutant(
        "advantage_batch_std_unbiased",
        f"{GRPO}/advantages.py::group_advantages",
        "rewards.double().std(unbiased=unbiased)",
        "rewards.double().std()",
        "batch_std always unbiased (advantage_std ignored)",
        MATH,
    ),
    Mutant(
        "zero_variance_layout",
        f"{GRPO}/advantages.py::zero_variance_groups",
        "return flat.repeat_interleave(group_size)",
        "return flat.repeat(group_size)",
        "flat-group flags tiled instead of repeated per sample",
        MATH,
    ),
    Mutant(
        "tracker_min_count_off_by_one",
        f"{GRPO}/advantages.py::PromptTracker.__call__",
        "if len(seen) < self.min_count:",
        "if len(seen) <= self.min_count:",
        "tracker falls back to batch stats at exactly min_count",
        MATH,
    ),
    Mutant(
        "tracker_std_unbiased",
        f"{GRPO}/advantages.py::PromptTracker.__call__",
        "seen.std(unbiased=False)",
        "seen.std()",
        "tracker normalises by the unbiased std",
        MATH,
    ),
    # ------------------------------------------------ KL
    Mutant(
        "gaussian_kl_no_half",
        f"{GRPO}/kl.py::gaussian_kl",
        "_reduce(0.5 * diff.pow(2), channel_reduction)",
        "_reduce(diff.pow(2), channel_reduction)",
        "Gaussian KL without the 1/2",
        MATH,
    ),
    Mutant(
        "k3_reversed",
        f"{GRPO}/kl.py::k3_logp",
        "d = ref_logp.float() - logp.float()",
        "d = logp.float() - ref_logp.float()",
        "k3 of the reversed log-ratio",
        MATH + KL_TERM,
    ),
    Mutant(
        "k3_cancellation",
        f"{GRPO}/kl.py::k3_logp",
        "return torch.expm1(d) - d",
        "return torch.exp(d) - 1 - d",
        "k3 as exp(d) - 1 - d: fp32 cancellation for small d",
        MATH,
    ),
    Mutant(
        "channel_mean_is_sum",
        f"{GRPO}/kl.py::_reduce",
        "return per_channel.mean(-1)",
        "return per_channel.sum(-1)",
        "KL channel_reduction mean sums",
        MATH,
    ),
    # ------------------------------------------------ the chunk loss
    Mutant(
        "kl_sign_flipped",
        f"{GRPO}/objective.py::chunk_loss",
        "ChunkLoss(policy + kl_beta * kl,",
        "ChunkLoss(policy - kl_beta * kl,",
        "KL rewarded instead of penalised",
        KL_TERM,
    ),
    Mutant(
        "mte_rollout_weight_swapped",
        f"{GRPO}/objective.py::chunk_loss",
        "weights * ~mte_mask, None)",
        "weights * mte_mask, None)",
        "mte_include_rollout false: trajectory 0 kept on the MTE positions instead of the others",
        ("tests/test_parity_loss.py::test_mte_weighs_the_seeds_only",),
    ),
    Mutant(
        "token_scale_wrong_dim",
        f"{GRPO}/objective.py::chunk_loss",
        "token_scale = 1.0 / mean.shape[-1]",
        "token_scale = 1.0 / mean.shape[-2]",
        "channel mean divides by the token count, not the channels",
        KL_TERM,
    ),
    Mutant(
        "pixel_scale_missing",
        f"{GRPO}/objective.py::chunk_loss",
        "scale = token_scale * pixels_per_token",
        "scale = token_scale",
        "a pixel's log-prob not scaled to its token's",
        ("tests/test_parity_loss.py::test_pixel_positions_and_recorded_std_on_a_real_rollout",),
    ),
    # ------------------------------------------------ update()
    Mutant(
        "consistency_start_off_by_one",
        f"{GRPO}/policy_update.py::token_selection",
        "if rollout.effective_index(j) >= config.consistency_start_step:",
        "if rollout.effective_index(j) > config.consistency_start_step:",
        "consistency starts one mask step late",
        SELECTION,
    ),
    Mutant(
        "rescore_ignores_bf16",
        f"{GRPO}/policy_update.py::rescores_old",
        "return unguided or bf16 or half",
        "return unguided or half",
        "bf16 autocast does not rescore the old log-probs",
        (f"{OBJ}::test_which_updates_rescore_their_old_logprobs",),
    ),
    Mutant(
        "grads_accumulate_across_minibatches",
        f"{GRPO}/policy_update.py::update",
        "                optimizer.zero_grad(set_to_none=True)\n                for images, steps in minibatch:",
        "                pass\n                for images, steps in minibatch:",
        "gradients not zeroed between optimizer steps",
        ("tests/test_grpo_update.py",),
    ),
    Mutant(
        "metrics_not_averaged_over_epochs",
        f"{GRPO}/policy_update.py::update",
        "collectives.mean(value / config.inner_epochs)",
        "collectives.mean(value)",
        "loss metrics summed over inner epochs",
        (f"{OBJ}::test_metrics_are_means_over_inner_epochs",),
    ),
    Mutant(
        "seed_trajectories_dropped_under_mte",
        f"{GRPO}/policy_update.py::_transition_losses",
        "if mte is None:  # without MTE",
        "if True:  # without MTE",
        "the update scores trajectory 0 alone under MTE too (the seeds' average is lost)",
        UPDATE,
    ),
    Mutant(
        "seed_rows_guided_by_the_conditional_rows",
        f"{ROLL}/guidance.py::condition_at",
        "condition[count + tokens]",
        "condition[tokens]",
        "the seeds scored at the MTE tokens (or drawn for them) take the conditional rows for the unconditional half too",
        ("tests/test_grpo_update.py",),
    ),
    Mutant(
        "mte_seed_rows_from_the_first_recorded_diffusion_step",
        f"{ROLL}/likelihood.py::rollout_logprob",
        "mask.any(1)",
        "mask[:, 0]",
        "a token's seeds are scored only when its first recorded transition is selected",
        ("tests/test_grpo_update.py",),
    ),
    Mutant(
        "deferred_seeds_written_at_the_committed_columns",
        f"{ROLL}/generate.py::_Generation._draw_seeds",
        "rows % Q + n",
        "rows % Q",
        "the deferred seed chains' records land at the step's committed tokens instead of the selected ones",
        ("tests/test_grpo_update.py",),
    ),
    Mutant(
        "deferred_seeds_take_the_main_chains_noise",
        f"{ROLL}/generate.py::_Generation._draw_seeds",
        "self.noise_bank[:, :, :, 1:]",
        "self.noise_bank[:, :, :, :K]",
        "the deferred seed chains draw trajectories 0..K-1's noise instead of 1..K's",
        ("tests/test_grpo_update.py",),
    ),
    Mutant(
        "training_rollouts_defer_under_the_matching_estimator",
        "margrpo/train/step.py::deferred_seed_selection",
        'if config.grpo.estimator != "transition" or config.rollout.seed_selection_conflicts():',
        "if config.rollout.seed_selection_conflicts():",
        "the rollout defers seed chains under the matching estimator, whose loss reads other seed values",
        ("tests/test_trainer.py",),
    ),
    Mutant(
        "compiled_head_recompiles_per_token_count",
        "margrpo/heads/compiled.py::compiled_step_output",
        "        torch._dynamo.maybe_mark_dynamic(x, x.dim() - 2)\n",
        "",
        "the compiled head output is compiled again for the second token count of a rollout",
        ("tests/test_compile_head.py",),
    ),
    Mutant(
        "compiled_head_bakes_in_the_guidance_scale",
        "margrpo/heads/compiled.py::compiled_step_output",
        "scale = None if cfg is None else torch.full((), cfg.scale, dtype=torch.float32, device=cond.device)",
        "scale = None",
        "the compiled head output takes the guidance scale as a constant: a scale schedule recompiles every mask step",
        ("tests/test_compile_head.py",),
    ),
    Mutant(
        "compiled_head_compiles_a_single_token",
        "margrpo/heads/compiled.py::compiled_step_output",
        "if _FAILED or x.shape[-2] == 1:",
        "if _FAILED:",
        "a one-token head call compiles a graph of its own (seconds inside the step that first reveals one token)",
        ("tests/test_compile_head.py",),
    ),
    Mutant(
        "compile_head_auto_compiles_on_cpu",
        "margrpo/rollout/config.py::RolloutConfig.compiles_head",
        'return torch.device(device).type == "cuda" and not self.cuda_graph',
        "return not self.cuda_graph",
        "rollout.compile_head auto compiles on a CPU too (minutes of compiling in a short CPU run)",
        ("tests/test_compile_head.py",),
    ),
    Mutant(
        "mte_tokens_ignore_the_k_rule",
        f"{GRPO}/selection.py::mte_tokens",
        "k_rule=config.mte_k).any(-1)",
        'k_rule="floor").any(-1)',
        "the rollout defers seed chains for the floor rule's tokens whatever grpo.mte_k is",
        ("tests/test_grpo_update.py",),
    ),
    Mutant(
        "samples_or",
        f"{GRPO}/policy_update.py::_transition_losses",
        "keep = keep & samples.to(keep.device)",
        "keep = keep | samples.to(keep.device)",
        "left-out images stay in the policy term",
        (f"{OBJ}::test_left_out_images_leave_the_normaliser",),
    ),
    Mutant(
        "kl_weights_follow_selection",
        f"{GRPO}/policy_update.py::update_weights",
        "grouped_token_weights(torch.ones(B, L, dtype=torch.bool, device=keep.device),",
        "grouped_token_weights(keep.any(-1),",
        "KL averaged over the selected transitions only",
        WEIGHTS,
    ),
    # ------------------------------------------------ selection
    Mutant(
        "random_positions_replace_topk",
        f"{GRPO}/selection.py::mte_mask",
        "selected = selected | ops.topk_mask(draws, k=random_positions)",
        "selected = ops.topk_mask(draws, k=random_positions)",
        "random MTE positions replace the top-k",
        SELECTION,
    ),
    Mutant(
        "reference_count_no_minimum",
        f"{GRPO}/selection.py::reference_mte_count",
        "return min(positions, max(1, int(positions * ratio)))",
        "return min(positions, int(positions * ratio))",
        "reference MTE count may be 0",
        SELECTION,
    ),
    # ------------------------------------------------ rollout
    Mutant(
        "post_step_drops_first_step",
        f"{ROLL}/plan.py::choose_plan",
        "candidates_mask = candidates_mask[:-1]",
        "candidates_mask = candidates_mask[1:]",
        "post_step leaves out the first effective step, not the last",
        KNOWN_MASK,
    ),
    Mutant(
        "diffusion_range_inclusive",
        f"{ROLL}/plan.py::choose_plan",
        "if start <= i < stop]",
        "if start <= i <= stop]",
        "record_diffusion_range includes its stop",
        ("tests/test_rollout.py::test_plan_diffusion_range_limits_the_candidates",),
    ),
    Mutant(
        "previous_prediction_is_current",
        f"{ROLL}/generate.py::_Generation._record",
        "if self.last_prediction is None else self.last_prediction",
        "if self.last_prediction is None else prediction",
        "consistency's previous prediction is the current one",
        ("tests/test_rollout.py::test_unknown_mode_predictions",),
    ),
    Mutant(
        "record_steps_and_positions_swapped",
        f"{ROLL}/generate.py::_Generation._record",
        "self.records[j] = {name: value.flatten(2, 3) for name, value in drawn.items()}",
        "self.records[j] = {name: value.transpose(2, 3).flatten(2, 3) for name, value in drawn.items()}",
        "a recorded step's part of L is stored position-major, not step-major as the likelihood reads it",
        ("tests/test_grpo_update.py::test_recorded_transitions_index_l_as_documented",),
    ),
    Mutant(
        "cfg_scale_before_step",
        f"{ROLL}/generate.py::_Generation.mask_step",
        "scale = config.cfg_scale_at(start + n, N)",
        "scale = config.cfg_scale_at(start, N)",
        "linear CFG schedule one step behind",
        ("tests/test_rollout.py::test_rollout_matches_plain_reference_at_the_planned_steps",),
    ),
    Mutant(
        "seed_tokens_include_rollout",
        f"{ROLL}/generate.py::_Generation.mask_step",
        "chains[1:, :, :n])",
        "chains[:K, :, :n])",
        "MTE seed tokens include the rollout's own trajectory",
        ROLLOUT,
    ),
    Mutant(
        "likelihood_cfg_ignored",
        f"{ROLL}/likelihood.py::rollout_logprob",
        'guided = rollout.config.uses_cfg and cfg == "rollout"',
        "guided = rollout.config.uses_cfg",
        "likelihood_cfg none still scores with guidance",
        ("tests/test_rollout.py::test_likelihood_steps_subset_and_cfg_option",),
    ),
    Mutant(
        "likelihood_temperature_ignored",
        f"{ROLL}/likelihood.py::rollout_logprob",
        "temperature=rollout.config.temperature,",
        "temperature=1.0,",
        "training likelihood ignores the sampling temperature",
        ("tests/test_rollout.py::test_on_policy_recomputation_equals_recorded_logprobs",),
    ),
    # ------------------------------------------------ trainer
    Mutant(
        "warmup_off_by_one",
        f"{TRAIN}::Trainer._build_optimizer.factor",
        "return (step + 1) / o.warmup_steps",
        "return step / o.warmup_steps",
        "warmup starts at lr 0",
        (f"{OPTIM}::test_lr_schedule_follows_the_step_count_through_skipped_steps",),
    ),
    Mutant(
        "optim_grad_clip_ignored",
        f"{STEP}::_rollout_and_update",
        "grad_clip = math.inf if t.config.optim.grad_clip is None else t.config.optim.grad_clip",
        "grad_clip = math.inf",
        "optim.grad_clip ignored",
        (f"{OPTIM}::test_optimizer_steps_see_gradients_clipped_to_optim_grad_clip",),
    ),
    Mutant(
        "frozen_head_gets_gradients",
        f"{TRAIN}::Trainer._configure_trainable",
        'self.policy.head.requires_grad_(g.head != "frozen")',
        "self.policy.head.requires_grad_(True)",
        "a frozen head still gets gradients (and enters the clip norm)",
        (f"{OPTIM}::test_a_frozen_head_gets_no_gradient_and_stays_out_of_the_clip_norm",),
    ),
    Mutant(
        "ref_policy_is_the_policy",
        f"{TRAIN}::Trainer.__init__",
        "self.ref_policy = copy.deepcopy(self.policy).eval().requires_grad_(False)",
        "self.ref_policy = self.policy",
        "the KL's ref policy moves with the policy (KL always 0)",
        (f"{OPTIM}::test_the_kl_ref_policy_stays_the_starting_policy",),
    ),
    Mutant(
        "same_plan_every_step",
        f"{STEP}::record_plan",
        "manual_seed(t.config.run.seed * 7_919 + step)",
        "manual_seed(t.config.run.seed * 7_919)",
        "every step records the same mask/diffusion steps",
        (f"{OPTIM}::test_every_step_draws_new_noise_and_prompts",),
    ),
    Mutant(
        "advantage_std_option_ignored",
        f"{STEP}::group_advantages",
        'unbiased=g.advantage_std == "unbiased"',
        "unbiased=False",
        "grpo.advantage_std ignored by the trainer",
        ("tests/test_parity_loss.py::test_unbiased_advantage_std",),
    ),
    Mutant(
        "drop_zero_variance_inverted",
        f"{STEP}::_rollout_and_update",
        "samples = ~flat if",
        "samples = flat if",
        "drop_zero_variance trains on the flat groups only",
        (f"{OPTIM}::test_drop_zero_variance_trains_as_if_the_flat_groups_were_not_there",),
    ),
    # ------------------------------------------------ the ops' eager oracle (margrpo.ops.oracle)
    Mutant(
        "logprob_log_std_sign",
        f"{ORACLE}::gaussian_logprob_fwd",
        "elem = -0.5 * z * z - torch.log(std) - LOG_SQRT_2PI",
        "elem = -0.5 * z * z + torch.log(std) - LOG_SQRT_2PI",
        "Gaussian log-prob adds log std",
        _ops("gaussian_logprob"),
    ),
    Mutant(
        "logprob_grad_std_missing_div",
        f"{ORACLE}::gaussian_logprob_bwd",
        "grad_std = ge * (diff * diff * inv_var - 1.0) / std",
        "grad_std = ge * (diff * diff * inv_var - 1.0)",
        "d logp / d std without the 1/std",
        _ops("gaussian_logprob"),
    ),
    Mutant(
        "trajectory_std_unbiased",
        f"{ORACLE}::trajectory_std_fwd",
        "return (s - s[:1]).std(dim=0, unbiased=False).mean(-1)",
        "return (s - s[:1]).std(dim=0).mean(-1)",
        "uncertainty uses the unbiased std over seeds",
        _ops("trajectory_std"),
    ),
    Mutant(
        "topk_ascending",
        f"{ORACLE}::topk_indices_fwd",
        "dim=-1, descending=True, stable=True)",
        "dim=-1, descending=False, stable=True)",
        "top-k picks the smallest scores",
        _ops("topk"),
    ),
    Mutant(
        "consistency_kernel_reversed",
        f"{ORACLE}::consistency_mask_fwd",
        "(cosine_or_zero(cur, final) - cosine_or_zero(prev, final)) > threshold",
        "(cosine_or_zero(prev, final) - cosine_or_zero(cur, final)) > threshold",
        "consistency kernel's gain reversed",
        _ops("consistency"),
    ),
    Mutant(
        "surrogate_clip_bounds_swapped",
        f"{ORACLE}::grpo_surrogate_fwd",
        "ratio.clamp(1.0 - clip_low, 1.0 + clip_high)",
        "ratio.clamp(1.0 - clip_high, 1.0 + clip_low)",
        "asymmetric clip bounds swapped",
        _ops("grpo_surrogate"),
    ),
    Mutant(
        "surrogate_min_not_max",
        f"{ORACLE}::grpo_surrogate_fwd",
        "term = torch.maximum(unclipped, clipped)",
        "term = torch.minimum(unclipped, clipped)",
        "clipped surrogate takes the optimistic branch",
        _ops("grpo_surrogate"),
    ),
    Mutant(
        "surrogate_ratio_not_exponentiated",
        f"{ORACLE}::grpo_surrogate_fwd",
        "ratio = torch.exp(log_ratio)",
        "ratio = 1.0 + log_ratio",
        "ratio linearised (not exponentiated)",
        _ops("grpo_surrogate"),
    ),
    Mutant(
        "surrogate_clipped_ge",
        f"{ORACLE}::grpo_surrogate_fwd",
        "is_clipped = clipped > unclipped",
        "is_clipped = clipped >= unclipped",
        "gradient zeroed inside the clip range too",
        _ops("grpo_surrogate"),
    ),
    Mutant(
        "surrogate_approx_kl_sign",
        f"{ORACLE}::grpo_surrogate_fwd",
        "(w * (ratio - 1.0 - log_ratio)).sum()",
        "(w * (ratio - 1.0 + log_ratio)).sum()",
        "approx_kl diagnostic with the wrong sign of log r",
        _ops("grpo_surrogate"),
    ),
    # ------------------------------------------------ issue 30: corners that only other modules' tests guarded
    Mutant(
        "tracker_restore_unbounded",
        f"{GRPO}/advantages.py::PromptTracker.load_state_dict",
        "self.history = defaultdict(lambda: deque(maxlen=self.buffer_size))",
        "self.history = defaultdict(deque)",
        "a restored tracker's per-prompt buffers lose their bound",
        (f"{PROPS}::test_a_restored_tracker_equals_a_fresh_one_fed_the_same_rewards",),
    ),
    Mutant(
        "k3_pixels_strided",
        f"{GRPO}/objective.py::chunk_loss",
        "token_logp = logp.reshape(T, B, -1, pixels_per_token).sum(-1)",
        "token_logp = logp.reshape(T, B, pixels_per_token, -1).sum(-2)",
        "the KL's token log-prob sums strided pixels, not a token's own",
        (f"{PROPS}::test_k3_kl_scores_each_token_by_the_sum_of_its_pixels_logprobs",),
    ),
    Mutant(
        "minibatches_ceil_sized",
        f"{GRPO}/policy_update.py::minibatches",
        "count = min(config.minibatches, B)",
        "count = max(1, B // math.ceil(B / config.minibatches))",
        "minibatches of ceil(B / m) images: fewer optimizer steps than asked",
        (f"{PROPS}::test_optimizer_steps_per_pass_are_min_of_minibatches_and_units",),
    ),
    Mutant(
        "effective_index_is_raw",
        f"{ROLL}/record.py::Rollout.effective_index",
        "return sum(1 for n in self.reveal_counts[: self.plan.mask_steps[j]] if n > 0)",
        "return self.plan.mask_steps[j]",
        "effective mask-step index counts the steps that reveal nothing",
        (PROPS_FILE, "-k", "effective"),
    ),
    Mutant(
        "post_step_scored_at_temperature_1",
        f"{ROLL}/generate.py::_Generation._score_pending",
        "self.config.temperature,",
        "1.0,",
        "post-step transitions scored at temperature 1",
        (f"{ROLL_PROPS}::test_the_first_update_is_on_policy",),
    ),
    Mutant(
        "guidance_canvas_interleaved",
        f"{ROLL}/guidance.py::forward_rows",
        "canvas.repeat(repeat, 1, 1)",
        "canvas.repeat_interleave(repeat, 0)",
        "guided canvas rows interleaved: uncond rows see other images' canvases",
        (ROLL_PROPS,),
    ),
    Mutant(
        "guidance_prompts_swapped",
        f"{ROLL}/guidance.py::prompt_rows",
        "return PromptRows(cond.cat(uncond), 2)",
        "return PromptRows(uncond.cat(cond), 2)",
        "guided prompt rows [uncond; cond]",
        (ROLL_PROPS,),
    ),
    Mutant(
        "guidance_head_rows_reversed",
        f"{ROLL}/guidance.py::head_condition",
        "for half in z.chunk(rows.rows_per_image)])",
        "for half in reversed(z.chunk(rows.rows_per_image))])",
        "the head's condition rows [uncond; cond]",
        (ROLL_PROPS,),
    ),
    # ------------------------------------------------ equivalent: cannot change behaviour
    Mutant(
        "policy_stat_not_detached",
        f"{GRPO}/objective.py::chunk_loss",
        "policy.detach(), kl.detach(), clip_fraction",
        "policy, kl.detach(), clip_fraction",
        "ChunkLoss.policy keeps its graph",
        KL_TERM,
        equivalent="the statistic is only read as a number (update(): float(x.detach())), and the chunk's graph "
        "lives as long through ChunkLoss.loss anyway",
    ),
    Mutant(
        "reference_count_clamp_order",
        f"{GRPO}/selection.py::reference_mte_count",
        "return min(positions, max(1, int(positions * ratio)))",
        "return max(1, min(positions, int(positions * ratio)))",
        "reference MTE count clamps in the other order",
        SELECTION,
        equivalent="min(p, max(1, x)) == max(1, min(p, x)) for every p >= 1, and positions = N * P >= 1",
    ),
    Mutant(
        "micro_batch_steps_unsorted",
        f"{GRPO}/policy_update.py::minibatches",
        "parts = [sorted(steps[i :: config.micro_batches])",
        "parts = [steps[i :: config.micro_batches]",
        "mask-step micro-batches not re-sorted",
        UPDATE,
        equivalent="`steps` is already sorted (range(M) or a sorted minibatch part), and a slice of a sorted list is sorted",
    ),
    Mutant(
        "reinforce_no_detach",
        f"{GRPO}/policy_update.py::_chunk_loss",
        "old = logp.detach()",
        "old = logp",
        "reinforce: the baseline log-prob not detached",
        ("tests/test_grpo_update.py::test_update_gradient_is_the_full_batch_loss_gradient",),
        equivalent="ops.grpo_surrogate detaches old_logp itself and differentiates with respect to logp only "
        "(its documented contract), so the baseline gets no gradient either way",
    ),
    Mutant(
        "zero_variance_le",
        f"{GRPO}/advantages.py::zero_variance_groups",
        "flat = r.max(1).values == r.min(1).values",
        "flat = r.max(1).values <= r.min(1).values",
        "flat groups found with <= instead of ==",
        MATH,
        equivalent="a row's max is never below its min, so <= holds exactly when == does (NaN: both False)",
    ),
)


# ------------------------------------------------------------------------------------ applying a mutant
class MutationError(ValueError):
    """A mutant that cannot be applied as written (the list needs fixing)."""


def changed_lines(before: str, after: str) -> int:
    """How many lines differ, counted from the first differing line to the last (1: exactly one line
    changed; 0: none)."""
    a, b = before.splitlines(), after.splitlines()
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    return max(len(a), len(b)) - prefix - suffix


def scopes(text: str) -> dict[str, list[tuple[int, int]]]:
    """Every def and class of a module by dotted name (Class.method, outer.inner) -> its (first,
    last) lines, 1-based; a name defined twice (e.g. in both branches of an if) has two entries."""
    found: dict[str, list[tuple[int, int]]] = {}

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                found.setdefault(name, []).append((child.lineno, child.end_lineno))
                walk(child, name)
            else:
                walk(child, prefix)

    walk(ast.parse(text), "")
    return found


def region(mutant: Mutant, text: str) -> tuple[int, int]:
    """Character offsets [start, end) of the mutant's function in `text` (the whole text at module
    level); raises MutationError unless the function is defined exactly once."""
    if mutant.function is None:
        return 0, len(text)
    spans = scopes(text).get(mutant.function, [])
    if len(spans) != 1:
        raise MutationError(f"{mutant.name}: {mutant.function} is defined {len(spans)} times in {mutant.path}, expected exactly once")
    first, last = spans[0]
    starts = [0, *(i + 1 for i, c in enumerate(text) if c == "\n")]
    return starts[first - 1], starts[last] if last < len(starts) else len(text)


def apply(mutant: Mutant, text: str) -> str:
    """`text` (the contents of mutant.path) with the mutant applied; raises MutationError unless the
    original occurs exactly once in its function and the result differs from `text` in exactly one
    line."""
    start, end = region(mutant, text)
    body = text[start:end]
    found = body.count(mutant.original) if mutant.original else 0
    if found != 1:
        raise MutationError(
            f"{mutant.name}: the original text {mutant.original!r} occurs {found} times in {mutant.location}, expected exactly once"
        )
    mutated = text[:start] + body.replace(mutant.original, mutant.replacement) + text[end:]
    lines = changed_lines(text, mutated)
    if lines != 1:
        raise MutationError(f"{mutant.name}: changes {lines} lines of {mutant.path}, expected exactly one")
    return mutated


def check(mutants, root: Path = ROOT) -> list[str]:
    """Every problem of the list against the tree at `root` (empty: every mutant applies and compiles)."""
    problems, names = [], set()
    for m in mutants:
        if m.name in names:
            problems.append(f"{m.name}: duplicate name")
        names.add(m.name)
        if not m.tests:
            problems.append(f"{m.name}: no tests to run")
        if m.equivalent is not None and not m.equivalent.strip():
            problems.append(f"{m.name}: marked equivalent without a reason")
        path = root / m.path
        if not path.is_file():
            problems.append(f"{m.name}: {m.path} does not exist")
            continue
        try:
            compile(apply(m, path.read_text()), str(path), "exec")
        except MutationError as err:
            problems.append(str(err))
        except SyntaxError as err:
            problems.append(f"{m.name}: the mutated {m.path} does not compile ({err})")
        for test in m.tests:
            if test.startswith("-") or not test.startswith("tests/"):
                continue  # an option, or an option's value
            file, _, node = test.partition("::")
            if not (root / file).is_file():
                problems.append(f"{m.name}: test file {file} does not exist")
            elif node and not re.search(rf"^def {re.escape(node.split('[')[0])}\(", (root / file).read_text(), re.M):
                problems.append(f"{m.name}: {file} has no test {node}")
    return problems


# ------------------------------------------------------------------------------------ running
def tree_files(root: Path) -> list[str]:
    """The files of the tree: in a git checkout those git knows or would add, plus the built
    extension; elsewhere (a --commit snapshot) every file."""
    if not (root / ".git").exists():
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    listed = (
        subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, check=True, capture_output=True)
        .stdout.decode()
        .split("\0")
    )
    files = {f for f in listed if f and (root / f).is_file()}
    for pattern in EXTRA_FILES:
        files.update(str(p.relative_to(root)) for p in root.glob(pattern))
    return sorted(files)


def snapshot(root: Path, commit: str, dest: Path) -> None:
    """The files of `commit` (git archive) and the working tree's built extension, into `dest`."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=root, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    for pattern in EXTRA_FILES:
        for p in root.glob(pattern):
            shutil.copy2(p, dest / p.relative_to(root))


def copy_tree(root: Path, files: list[str], dest: Path) -> None:
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target)


@contextmanager
def mutated_copy(root: Path, files: list[str], mutant: Mutant | None, package: str = PACKAGE):
    """(tree, site): a temporary copy of `files` with `mutant` applied (None: unmutated), and the
    directory for PYTHONPATH, which holds only a link to the copy's `package`. Inside the copy each
    of PACKAGE_LINKS whose target exists is linked as the installed package lays it out."""
    with tempfile.TemporaryDirectory(prefix=f"margrpo-mutant-{mutant.name if mutant else 'baseline'}-") as tmp:
        tree, site = Path(tmp) / "tree", Path(tmp) / "site"
        copy_tree(root, files, tree)
        if mutant is not None:
            path = tree / mutant.path
            path.write_text(apply(mutant, path.read_text()))
        for link, target in PACKAGE_LINKS:  # as a wheel lays them out (the copy's root is not on the path)
            if not (tree / target).is_dir() or not (tree / link).parent.is_dir():
                continue
            if not (tree / link).exists():
                (tree / link).symlink_to(tree / target, target_is_directory=True)
            else:
                for source in sorted((tree / target).glob("*.py")):
                    if not (tree / link / source.name).exists():
                        (tree / link / source.name).symlink_to(source)
        site.mkdir()
        (site / package).symlink_to(tree / package, target_is_directory=True)
        yield tree, site


@dataclass
class Result:
    mutant: Mutant
    status: str  # caught, survived, timeout, error
    seconds: float  # wall clock
    cpu: float  # CPU seconds of pytest and its children (the wall clock of a shared machine says little)
    caught_by: str = ""
    detail: str = ""


def _env(site: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale .pyc of a mutated file can outlive its run
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_pytest(tree: Path, site: Path, tests, timeout: float, python: str) -> tuple[int | None, str, float, float]:
    """(exit code or None on timeout, output, wall seconds, CPU seconds) of pytest on `tests` in `tree`,
    importing the package through `site`."""
    cmd = [python, "-m", "pytest", *tests, *PYTEST_ARGS]
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.Popen(cmd, cwd=tree, env=_env(site), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the session holds pytest and anything it started
        out, _ = proc.communicate()
        code = None
    except BaseException:  # interrupted (SIGTERM, Ctrl-C): leave no pytest behind
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return code, out.decode(errors="replace"), time.perf_counter() - start, _children_cpu() - cpu


def first_failure(output: str) -> str:
    """The node id of the first failing (or erroring) test in pytest's -q summary."""
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return match.group(1).split(" - ")[0] if match else ""


def classify(code: int | None) -> str:
    if code is None:
        return "timeout"
    if code in (1, 2):  # tests failed / errors during collection
        return "caught"
    return "survived" if code == 0 else "error"


def run_mutant(mutant: Mutant, root: Path, files: list[str], timeout: float, python: str, package: str = PACKAGE) -> Result:
    with mutated_copy(root, files, mutant, package) as (tree, site):
        code, output, seconds, cpu = run_pytest(tree, site, mutant.tests, timeout, python)
    status = classify(code)
    if mutant.expect_output is not None and code not in (0, None):  # a control: its own failure, or an error
        status = "caught" if mutant.expect_output in output else "error"
    tail = "\n".join(output.strip().splitlines()[-3:])
    caught_by = (first_failure(output) or "(import)") if status == "caught" else ""
    return Result(mutant, status, seconds, cpu, caught_by, tail if status in ("error", "timeout") else "")


def baseline(mutants, root: Path, files: list[str], timeout: float, python: str, package: str = PACKAGE) -> tuple[bool, str, float]:
    """Run the union of the mutants' tests on the unmutated copy, the way the mutants run.
    (ok, message, seconds)."""
    groups, seen = [], set()
    for m in mutants:  # one pytest run per distinct selection with options ("-k"), one for the plain ones
        if any(t.startswith("-") for t in m.tests):
            if m.tests not in seen:
                seen.add(m.tests)
                groups.append(list(m.tests))
    plain = sorted({t for m in mutants if not any(x.startswith("-") for x in m.tests) for t in m.tests})
    if plain:
        groups.append(plain)
    total = 0.0
    with mutated_copy(root, files, None, package) as (tree, site):
        for tests in groups:
            code, output, seconds, _ = run_pytest(tree, site, tests, timeout * max(1, len(tests)), python)
            total += seconds
            if code != 0:
                return False, f"baseline {' '.join(tests)} -> exit {code}:\n{output[-3000:]}", total
    return True, "", total


# ------------------------------------------------------------------------------------ report
def machine_description() -> str:
    model = ""
    try:
        model = next(
            line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()}-core {model or platform.processor() or '?'} {platform.machine()}"


def score(results: list[Result]) -> tuple[int, int]:
    scored = [r for r in results if r.mutant.equivalent is None and r.mutant.expect_output is None]
    return sum(r.status == "caught" for r in scored), len(scored)


def report(results: list[Result], *, machine: str, total_seconds: float, baseline_seconds: float, command: str) -> str:
    caught, scored = score(results)
    equivalent = [r for r in results if r.mutant.equivalent is not None]
    controls = [r for r in results if r.mutant.expect_output is not None]
    try:
        import torch

        versions = f"Python {platform.python_version()}, torch {torch.__version__}"
    except ImportError:
        versions = f"Python {platform.python_version()}"
    lines = [
        f"# Mutation test of the GRPO, selection, rollout, trainer and op-oracle code ({datetime.date.today()})",
        "",
        f"- machine: {machine}; {versions}",
        f"- command: `{command}`",
        f"- **score: {caught} / {scored} non-equivalent mutants caught**"
        + (f" ({100 * caught / scored:.0f}%)" if scored else "")
        + f"; {len(equivalent)} equivalent (not scored)",
        f"- run time: {total_seconds:.0f} s wall clock in all ({baseline_seconds:.0f} s of it the unmutated baseline "
        f"run); the mutants' tests took {sum(r.cpu for r in results):.0f} CPU seconds",
        "",
        "Each mutant is one changed line, applied to a temporary copy of the tree and run against the tests",
        f"that cover it (`pytest {' '.join(PYTEST_ARGS)}`), which import the copy's margrpo through a",
        "package link on PYTHONPATH; the list and the tests of each are in scripts/mutation_test.py.",
        "",
        "| mutant | where | description | result | caught by | seconds (wall) | CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    if controls:
        lines[4:4] = [
            f"- control: {r.mutant.name} (importing margrpo raises) was **{r.status}**: "
            + ("the tests import the mutated copy" if r.status == "caught" else "NOTHING BELOW MEASURES THE TESTS")
            for r in controls
        ]
    for r in results:
        status = r.status + (" (equivalent)" if r.mutant.equivalent is not None else "")
        status += " (control)" if r.mutant.expect_output is not None else ""
        lines.append(
            f"| {r.mutant.name} | {r.mutant.location} | {r.mutant.description} | {status} | "
            f"{r.caught_by.removeprefix('tests/')} | {r.seconds:.1f} | {r.cpu:.1f} |"
        )
    if equivalent:
        lines += ["", "## Equivalent mutants", ""]
        lines += [f"- **{r.mutant.name}** (`{r.mutant.replacement.strip()}`): {r.mutant.equivalent}" for r in equivalent]
    missed = [r for r in results if r.mutant.equivalent is None and r.status != "caught"]
    if missed:
        lines += ["", "## Not caught", ""]
        lines += [f"- **{r.mutant.name}**: {r.status}" + (f" ({r.detail})" if r.detail else "") for r in missed]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true", help="check the list against the tree and exit")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this mutant (repeatable; the sentinel always runs first)")
    parser.add_argument(
        "--commit", metavar="REV", help="mutate the files of this commit instead of the working tree (a tree others are editing)"
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="wall-clock seconds per mutant (default 900: generous for a loaded shared machine)"
    )
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument("--machine", default=None, help="the machine, in words, for the report")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # clean up the temporary trees

    with tempfile.TemporaryDirectory(prefix="margrpo-mutation-snapshot-") as tmp:
        root = ROOT
        if args.commit:
            root = Path(tmp)
            snapshot(ROOT, args.commit, root)
        return _run(args, argv, root)


def _run(args, argv, root: Path) -> int:
    problems = check([SENTINEL, *MUTANTS], root)
    if problems:
        print("mutation list is broken:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    mutants = list(MUTANTS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in mutants})
        if unknown:
            print(f"--only: unknown mutants {', '.join(unknown)}; see --list", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for m in [SENTINEL, *mutants]:
            tag = "  [equivalent]" if m.equivalent else ""
            print(f"{m.name:<38} {m.location:<48} {m.description}{tag}\n{'':<39}tests: {' '.join(m.tests)}")
        return 0
    if args.check:
        print(f"the list is sound: the sentinel and {len(MUTANTS)} mutants apply to {root}")
        return 0

    started = time.perf_counter()
    files = tree_files(root)
    sentinel = run_mutant(SENTINEL, root, files, args.timeout, args.python)
    print(f"[sentinel] {SENTINEL.name}: {sentinel.status} ({sentinel.seconds:.1f} s)", flush=True)
    if sentinel.status != "caught":
        print(
            f"the sentinel was not caught ({sentinel.status}): the tests do not import the mutated copy, so no "
            f"mutant would be seen either. pytest said:\n{sentinel.detail}",
            file=sys.stderr,
        )
        return 2
    baseline_seconds = 0.0
    if not args.no_baseline:
        ok, message, baseline_seconds = baseline(mutants, root, files, args.timeout, args.python)
        print(f"baseline: {'ok' if ok else 'FAILED'} ({baseline_seconds:.0f} s)", flush=True)
        if not ok:
            print(message, file=sys.stderr)
            return 2
    results = [sentinel]
    for i, m in enumerate(mutants, 1):
        result = run_mutant(m, root, files, args.timeout, args.python)
        results.append(result)
        extra = f" by {result.caught_by}" if result.caught_by else (f": {result.detail}" if result.detail else "")
        flag = " (equivalent)" if m.equivalent else ""
        print(f"[{i}/{len(mutants)}] {m.name}: {result.status}{flag}{extra} ({result.seconds:.1f} s, {result.cpu:.1f} s CPU)", flush=True)
    total = time.perf_counter() - started
    command = shlex.join(["python", "scripts/mutation_test.py", *(argv if argv is not None else sys.argv[1:])])
    text = report(
        results, machine=args.machine or machine_description(), total_seconds=total, baseline_seconds=baseline_seconds, command=command
    )
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"written to {args.out}")
    caught, scored = score(results)
    return 0 if caught == scored else 1


if __name__ == "__main__":
    sys.exit(main())
