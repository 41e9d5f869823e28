"""The `margrpo` command: one subcommand per job, each implemented by a module's main(argv).

Exit codes: 0 done; 2 a usage or configuration error (the message names the key, no traceback)."""

from __future__ import annotations

import importlib
import sys

from margrpo.config import ConfigError

# subcommand -> (module with main(argv), one-line help)
COMMANDS = {
    "train": ("margrpo.train.trainer", "GRPO training: margrpo train --config configs/shapes-tiny.yaml [key=value ...]"),
    "pretrain": ("margrpo.train.pretrain", "pretrain the tiny ShapesWorld MAR model"),
    "sample": ("margrpo.sample", "generate PNG grids: --config FILE | --checkpoint RUN_OR_MODEL, --prompts FILE --out DIR"),
    "eval": ("margrpo.train.evaluate", "held-out reward of a run checkpoint, run or model directory"),
    "export": ("margrpo.train.export", "a run checkpoint as a model in its family's official layout (LoRA merged)"),
    "init-model": ("margrpo.models.init_model", "write a random-init NOVA/Harmon/tiny preset in its official layout"),
    "diagnose": ("margrpo.train.diagnostics", "why RL does or does not move a model: four checks on one GRPO step"),
    "ablate": ("margrpo.train.ablate", "run the ablation presets over seeds and print the table"),
    "bench": ("margrpo.bench.cli", "benchmarks: margrpo bench ops|denoise|rollout|rewards|step"),
    "serve-reward": ("margrpo.rewards.server", "serve a reward model over HTTP"),
}


def _usage() -> str:
    lines = ["usage: margrpo <command> [args]", "", "commands:"]
    lines += [f"  {name:<13} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"margrpo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        result = module.main(rest)
    except ConfigError as err:  # a bad setting: its message names the key; a traceback would only bury it
        print(f"margrpo {name}: error: {err}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
