"""margrpo.rollout: schedules, seeding, recording plan, the generation loop and the training likelihood.

The generation tests drive a tiny test backbone (an MLP over prompt words + canvas, defined here) with
the real diffusion head and sampler; shapes are kept small so the file runs in seconds on 2 cores.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from margrpo.models.base import MARBackbone, PromptBatch
from margrpo.rollout import schedule
from margrpo.rollout.config import RolloutConfig
from margrpo.rollout.plan import RecordPlan, choose_plan
from margrpo.rollout.seeding import group_seeds, make_generators, plan_seed, sample_seed


# ---------------------------------------------------------------- schedules
def _nova_by_hand(N: int, S: int) -> list[int]:
    masked = [int(np.round(N * math.cos(math.pi / 2 * k / S))) for k in range(S + 1)]
    return [masked[k] - masked[k + 1] for k in range(S)]


@pytest.mark.parametrize("N,S", [(1024, 64), (256, 16), (64, 16), (7, 5), (4, 8), (1, 3), (1000, 1)])
def test_nova_schedule_matches_formula_and_sums_to_n(N, S):
    counts = schedule.nova_schedule(N, S)
    assert counts == _nova_by_hand(N, S)
    assert len(counts) == S and sum(counts) == N and min(counts) >= 0


def test_nova_first_step_is_empty_at_real_sizes():
    counts = schedule.nova_schedule(1024, 64)
    assert counts[0] == 0 and len(schedule.effective_steps(counts)) == 63


@pytest.mark.parametrize("N,S", [(1024, 64), (256, 16), (64, 16), (16, 16), (7, 5), (4, 8), (1, 3)])
def test_harmon_schedule_matches_formula(N, S):
    counts = schedule.harmon_schedule(N, S)
    assert len(counts) == S and sum(counts) == N
    masked = N
    for step, count in enumerate(counts):
        if step < S - 1:
            target = max(1, min(masked - 1, math.floor(N * math.cos(math.pi / 2 * (step + 1) / S))))
        else:
            target = 0
        assert count == masked - target
        masked = target
    if N >= S:  # every step reveals at least one token
        assert min(counts) >= 1


def test_harmon_schedule_known_values():
    # N=16, S=4: floor(16 cos(pi/8)) = 14, floor(16 cos(pi/4)) = 11, floor(16 cos(3pi/8)) = 6
    assert schedule.harmon_schedule(16, 4) == [2, 3, 5, 6]
    assert schedule.nova_schedule(16, 4) == [1, 4, 5, 6]  # round(16 cos) = 16, 15, 11, 6, 0


def test_schedule_errors_name_the_argument():
    with pytest.raises(ValueError, match="schedule"):
        schedule.mask_schedule(16, 4, "cosine-ish")
    with pytest.raises(ValueError, match="num_tokens"):
        schedule.mask_schedule(0, 4)
    with pytest.raises(ValueError, match="num_mask_steps"):
        schedule.mask_schedule(16, 0, "harmon")


# ---------------------------------------------------------------- seeding
def test_sample_seeds_are_distinct_and_deterministic():
    seeds = {sample_seed(7, r, p, s) for r in range(3) for p in range(5) for s in range(4)}
    assert len(seeds) == 60
    assert sample_seed(7, 1, 2, 3) == sample_seed(7, 1, 2, 3)
    assert all(0 <= s < 2**63 for s in seeds)
    assert group_seeds(7, 1, [2, 5], 3) == [sample_seed(7, 1, p, s) for p in (2, 5) for s in range(3)]
    with pytest.raises(ValueError, match="rank"):
        sample_seed(7, -1, 0, 0)
    with pytest.raises(ValueError, match="group_size"):
        group_seeds(7, 0, [0], 0)


def test_generators_reproduce_their_stream():
    a, b = make_generators([11, 12], "cpu")
    (a2,) = make_generators([11], "cpu")
    x = torch.randn(5, generator=a)
    assert torch.equal(x, torch.randn(5, generator=a2))
    assert not torch.equal(x, torch.randn(5, generator=b))
    assert plan_seed([1, 2]) == plan_seed([1, 2]) != plan_seed([2, 1])


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    "field,value",
    [("cfg_scale", -0.5), ("temperature", 0.0), ("num_seeds", -1), ("num_mask_steps", 0),
     ("schedule", "linear"), ("cfg_schedule", "cosine"), ("cfg_channels", "var"),
     ("record_mask_steps", -1), ("record_diffusion_steps", 0), ("likelihood_positions", "all")],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RolloutConfig(**{field: value})


def test_cfg_schedules():
    constant = RolloutConfig(cfg_scale=5.0)
    linear = RolloutConfig(cfg_scale=5.0, cfg_schedule="linear")
    assert constant.cfg_scale_at(3, 16) == 5.0
    assert linear.cfg_scale_at(4, 16) == pytest.approx(2.0) and linear.cfg_scale_at(16, 16) == 5.0
    assert not RolloutConfig().uses_cfg and constant.uses_cfg and RolloutConfig(cfg_scale=0.0).uses_cfg
