"""margrpo.rollout: the MAR generation loop and what it records for GRPO training.

from margrpo.rollout import RolloutConfig, generate, group_seeds, rollout_logprob
seeds = group_seeds(base_seed, rank, prompt_indices, group_size)
rollout = generate(backbone, prompts, RolloutConfig(...), seeds, sampler=sampler)
likelihood = rollout_logprob(backbone, rollout)   # logp [T, B, L] with gradient to the backbone
"""

from .config import RolloutConfig
from .generate import generate
from .likelihood import RolloutLikelihood, rollout_logprob
from .plan import RecordPlan, choose_plan
from .record import Rollout, RolloutChunk
from .schedule import effective_steps, harmon_schedule, mask_schedule, nova_schedule
from .seeding import group_seeds, make_generators, mirror_pairs, sample_seed, shared_seed

__all__ = [
    "RecordPlan",
    "Rollout",
    "RolloutChunk",
    "RolloutConfig",
    "RolloutLikelihood",
    "choose_plan",
    "effective_steps",
    "generate",
    "group_seeds",
    "harmon_schedule",
    "make_generators",
    "mask_schedule",
    "nova_schedule",
    "rollout_logprob",
    "sample_seed",
    "shared_seed",
    "mirror_pairs",
]
