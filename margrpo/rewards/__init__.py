"""Rewards for GRPO: a protocol, a registry by name, weighted sums, and an HTTP reward service.

    from margrpo.rewards import build_reward, build_rewards
    hps = build_reward("hps", path="/weights/hps/HPS_v2.1_compressed.pt", device="cuda")
    scores = hps(images, prompts)                       # float32 [B]
    mix = build_rewards({"hps": 1.0, "shapes": 0.5})    # WeightedReward
    result = mix(images, prompts, metadata)             # result.total, .raw, .normalized

Heavy dependencies (open_clip, transformers, timm) are imported only when a reward that needs them
is built, so this package imports with torch alone. Weights come from local paths only: the
reward's `path` option or $MARGRPO_WEIGHTS_DIR in the layout each reward documents.
"""

from . import aesthetic, clip_score, git_vqa, grounding_dino, hps, image_reward, jpeg, shapes  # noqa: F401 (registration)
from .base import Metadata, MissingMetadataError, Reward, to_unit_float
from .client import RemoteReward, RewardServiceError
from .registry import available_rewards, build_reward, register, reward_class, reward_options
from .weighting import NORMALIZATIONS, RewardResult, RewardTerm, WeightedReward, build_rewards
from .weights import WEIGHTS_DIR_ENV, CorruptWeightsError, MissingWeightsError

__all__ = [
    "CorruptWeightsError",
    "Metadata",
    "MissingMetadataError",
    "MissingWeightsError",
    "NORMALIZATIONS",
    "RemoteReward",
    "Reward",
    "RewardResult",
    "RewardServiceError",
    "RewardTerm",
    "WEIGHTS_DIR_ENV",
    "WeightedReward",
    "available_rewards",
    "build_reward",
    "build_rewards",
    "register",
    "reward_class",
    "reward_options",
    "to_unit_float",
]
