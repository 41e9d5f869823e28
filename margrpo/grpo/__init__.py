"""margrpo.grpo: the GRPO algorithm over a recorded rollout (no model code, no trainer).

margrpo.grpo.policy_update  update(): one GRPO update (selection, loss, backward, clip, step)
margrpo.grpo.config         GRPOConfig, the algorithm's switches
margrpo.grpo.advantages     group-relative advantages and their variants
margrpo.grpo.selection      MAR-GRPO token selection (uncertainty top-k for MTE, consistency)
margrpo.grpo.objective      the clipped policy term + KL of a chunk of recorded transitions
margrpo.grpo.kl             the KL variants
"""

from .config import GRPOConfig, LoRAConfig
from .policy_update import Collectives, UpdateResult, update

__all__ = ["Collectives", "GRPOConfig", "LoRAConfig", "UpdateResult", "update"]
