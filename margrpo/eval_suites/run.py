"""`margrpo eval --suite NAME`: generate a suite's prompts with the trainer's policy and score them.

Images come from the policy as the held-out evaluation makes them (fixed seeds from run.eval_seed, the
EMA weights with run.eval_ema), `--samples-per-prompt` per prompt (default run.eval_samples_per_prompt).
The report is printed as a table and written as JSON (--out, default eval-<suite>.json).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from margrpo.config import ConfigError

from . import SUITES, SuiteReport, build_suite, suite_options


SUITE_OPTIONS = ("detector", "clip", "data", "categories", "blip", "depth", "spacy", "weights", "reward_options", "compare")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("suites")
    group.add_argument("--suite", choices=list(SUITES), help="score a benchmark suite, reported per category")
    group.add_argument(
        "--per-category", type=int, help="prompts per category (default: geneval 50, shapes run.eval_per_category, t2i-compbench all)"
    )
    group.add_argument("--samples-per-prompt", type=int, help="images per prompt (default run.eval_samples_per_prompt)")
    group.add_argument("--prompts", help="a prompt file: geneval (.jsonl, instead of its prompts), preference (required)")
    group.add_argument("--detector", help="geneval, t2i-compbench: the GroundingDINO directory (Hugging Face layout)")
    group.add_argument("--clip", help="geneval: the CLIP directory for colours; t2i-compbench: CLIP ViT-B/32 (Hugging Face layout)")
    group.add_argument("--data", help="t2i-compbench: a local checkout of T2I-CompBench (or its examples/dataset)")
    group.add_argument("--categories", help="t2i-compbench: comma-separated categories (default all)")
    group.add_argument("--blip", help="t2i-compbench: the BLIP-VQA directory (Hugging Face layout)")
    group.add_argument("--depth", help="t2i-compbench: the DPT depth directory for 3d_spatial (Hugging Face layout)")
    group.add_argument(
        "--spacy", help="t2i-compbench: a spaCy pipeline name or directory, or 'rules' (default en_core_web_sm when installed, else rules)"
    )
    group.add_argument("--weights", help="preference: the reward weights root (default $MARGRPO_WEIGHTS_DIR)")
    group.add_argument(
        "--reward-option",
        dest="reward_options",
        action="append",
        metavar="REWARD.OPTION=VALUE",
        help="preference: a reward's option, e.g. pickscore.processor_path=DIR (repeatable)",
    )
    group.add_argument("--compare", help="preference: an earlier preference report (JSON) to set side by side")
    group.add_argument("--out", help="where to write the JSON report (default eval-<suite>.json)")


def suite_records(suite, args: argparse.Namespace, run):
    """The prompts to score: --prompts, else the suite's own (--per-category of each category; default
    the suite's, or run.eval_per_category for a suite without one), seeded by run.eval_seed."""
    from margrpo.prompt_files import PromptFileError, read_prompt_records

    if args.prompts:
        try:
            records = read_prompt_records(args.prompts)
        except (FileNotFoundError, PromptFileError) as err:
            raise ConfigError(f"--prompts: {err}") from err
        if not records:
            raise ConfigError(f"--prompts: {args.prompts} holds no prompt")
        return records
    per_category = suite.default_per_category or run.eval_per_category
    per_category = per_category if args.per_category is None else args.per_category
    if per_category < 1:
        raise ConfigError(f"--per-category: got {per_category}, expected an integer >= 1")
    return suite.prompts(per_category, run.eval_seed)


def run_suite(trainer, args: argparse.Namespace) -> SuiteReport:
    """Build the suite, generate its images with the trainer's policy, score, print and write the report."""
    from margrpo.train.evaluate import check_prompts_known, generate_images

    run = trainer.config.run
    records = None
    if args.prompts:  # a prompt file is checked before any scorer loads (a detector takes minutes)
        records = suite_records(None, args, run)
        try:
            SUITES[args.suite].check_records(records)
        except ValueError as err:
            raise ConfigError(f"--prompts: {err}") from err
        check_prompts_known(trainer.policy, [r.prompt for r in records], "--prompts")
    # every suite option given on the command line; build_suite refuses one the suite does not take
    options = {k: getattr(args, k, None) for k in SUITE_OPTIONS}
    options = {k: v for k, v in options.items() if v is not None}
    if "device" in suite_options(args.suite):  # a scorer with models runs where the policy does
        options["device"] = str(trainer.device)
    try:
        suite = build_suite(args.suite, **options)
    except (ValueError, FileNotFoundError) as err:  # a bad option, a missing prompt or weights file: named
        raise ConfigError(f"--suite {args.suite}: {err}") from err
    if records is None:
        records = suite_records(suite, args, run)
        check_prompts_known(trainer.policy, [r.prompt for r in records], f"--suite {args.suite}")
    samples = run.eval_samples_per_prompt if args.samples_per_prompt is None else args.samples_per_prompt
    if samples < 1:
        raise ConfigError(f"--samples-per-prompt: got {samples}, expected an integer >= 1")
    trainer.policy.eval()
    with trainer.ema.swapped_in() if run.eval_ema and trainer.ema is not None else contextlib.nullcontext():
        _, images = generate_images(
            trainer.policy, trainer.sampler, trainer.config.rollout, [r.prompt for r in records], samples, run.eval_seed
        )
    report = suite.score(images, [r for r in records for _ in range(samples)])
    report.settings = {
        "prompts": args.prompts or f"{args.suite} ({len(records)} generated)",
        "samples_per_prompt": samples,
        "seed": run.eval_seed,
        "step": trainer.step,
    }
    print(report.table())
    out = report.write(args.out or f"eval-{args.suite}.json")
    print(f"report: {Path(out)}")
    return report
