"""scripts/step_flops.py: the FLOPs of one GRPO step grow with the work the config asks for."""

from __future__ import annotations

from pathlib import Path
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
step_flops = load_script("scripts/step_flops.py", "step_flops")

SMALL = [
    "grpo.prompts_per_step=1",
    "grpo.group_size=2",
    "rollout.num_mask_steps=4",
    "rollout.record_mask_steps=2",
    "backbone.diffusion_steps=4",
    "rollout.record_diffusion_steps=2",
]


def test_a_step_that_scores_more_positions_counts_more_flops():
    config = str(ROOT / "configs" / "shapes-tiny.yaml")
    revealed = step_flops.step_flops(config, SMALL, warmup=0)
    unknown = step_flops.step_flops(config, [*SMALL, "rollout.likelihood_positions=unknown"], warmup=0)
    assert revealed["gflop"] > 0 and unknown["gflop"] > revealed["gflop"]
    assert abs(sum(revealed["gflop_per_op"].values()) - revealed["gflop"]) < 1e-6 * revealed["gflop"]
    assert any("mm" in op for op in revealed["gflop_per_op"])
