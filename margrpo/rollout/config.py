"""RolloutConfig: every knob of the MAR generation loop and of what it records (typed, validated)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch

from margrpo.config import Rule, check_rules, finite

from .schedule import SCHEDULES


@dataclass
class RolloutConfig:
    """Generation and recording settings.

    Generation: `num_mask_steps` S with the `schedule` variant; `num_diffusion_steps` T of the head's
    sampler (None: the model's default, backbone.make_sampler()); classifier-free guidance with
    `cfg_scale` (1.0 = off; 0 = unconditional), `cfg_schedule` "constant" or "linear" (MUSE/MAR:
    1 + (scale - 1) * revealed_after_step / N), `cfg_channels` "all" (NOVA) or "eps" (Harmon: guide
    only the first C output channels, variance from the conditional half), `negative_prompt`
    (None = the backbone's); `temperature` multiplies every diffusion step's std.

    Multi-trajectory expectation: `num_seeds` K extra diffusion trajectories per denoised token,
    sampled under the same z as the main one (trajectory 0) in one batched head pass.

    Recording for the likelihood: `record_mask_steps` effective mask steps and, in each,
    `record_diffusion_steps` stochastic diffusion steps, drawn before the rollout, among the steps
    start <= i < stop of `record_diffusion_range` (None: all; stop None: to the end; 0 = noisiest).
    Skipping step 0 matters for epsilon-prediction DDPM with a cosine schedule: its beta is clipped
    near 1, so the transition's mean is the eps prediction amplified about 30x, and its score
    dominates the gradient's variance while its sample barely shapes the image (docs/METHOD.md).
    `likelihood_positions` says which tokens of a recorded mask step enter the likelihood:
    "revealed" (default: the tokens actually sampled into the image at that step, an exact policy
    gradient) or "unknown" (the paper / reference code: every position still masked before the
    step; the head also samples the positions that stay masked, their samples are discarded from the
    image but their transitions are recorded, and the per-step predicted clean latents needed by
    consistency-aware selection are recorded; costs roughly N / n_i more head work at those steps).
    `known_mask` says which tokens a recorded step's likelihood treats as known (the canvas of its
    training forward): "pre_step" (default: those revealed at earlier steps, the state the step was
    sampled from, so the step's own tokens get gradient) or "post_step" (the reference Harmon code,
    for the parity preset: the step's own tokens are known too and get no gradient; the likelihood
    keeps only the positions still unknown after the step, their transitions sampled at the step and
    scored under the post-step canvas, the one the next mask step's forward sees). "post_step" needs
    likelihood_positions "unknown" whenever a likelihood is recorded: with "revealed" it would keep
    no position at all. A recorded final step leaves no position unknown and records nothing.
    """

    num_mask_steps: int = 64
    schedule: Literal["nova", "harmon"] = "nova"
    num_diffusion_steps: int | None = None
    cfg_scale: float = 1.0
    cfg_schedule: Literal["constant", "linear"] = "constant"
    cfg_channels: Literal["all", "eps"] = "all"
    negative_prompt: str | None = None
    temperature: float = 1.0
    num_seeds: int = 0
    record_mask_steps: int = 12
    record_diffusion_steps: int = 10
    record_diffusion_range: tuple[int | None, ...] | None = None  # (start, stop)
    likelihood_positions: Literal["revealed", "unknown"] = "revealed"
    known_mask: Literal["pre_step", "post_step"] = "pre_step"
    # where the K seed chains of a recorded transition come from: "step" (drawn at the recorded step
    # under its z) or "commit" (the reference code: drawn under each token's commit-time z, scored
    # under the recorded step's z; margrpo.rollout.commit_chains)
    seed_chains: Literal["step", "commit"] = "step"
    # replay the head's T-step chain of each mask step that records nothing from a captured CUDA graph
    # (margrpo.heads.cuda_graph: no per-kernel launch cost on the host; CUDA only)
    cuda_graph: bool = False
    # run each diffusion step's head output (modulation, blocks, guidance) as one torch.compile graph
    # (margrpo.heads.compiled: compile fuses the head's elementwise work; the sampler step stays a
    # fused op); "auto": on CUDA, where compiling NOVA's head beat the uncompiled loop on an H200,
    # unless cuda_graph is on; not on a CPU, where compiling takes longer than it saves in a short run
    compile_head: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        check_rules(self, RULES)
        window = self.record_diffusion_range
        if not (
            window is None
            or (
                isinstance(window, (tuple, list))
                and len(window) == 2
                and type(window[0]) is int
                and window[0] >= 0
                and (window[1] is None or (type(window[1]) is int and window[1] > window[0]))
            )
        ):
            raise ValueError(
                f"record_diffusion_range: got {window!r}, expected null or [start, stop] with "
                "integers 0 <= start < stop (stop null: to the end)"
            )
        if window is not None:
            self.record_diffusion_range = (window[0], window[1])
        if self.record_mask_steps > 0:
            self.check_recordable()

    def check_recordable(self) -> None:
        """Raise if these settings cannot form a likelihood for a recorded mask step. Checked when
        record_mask_steps > 0 (and by generate for an explicit plan): a config that records nothing,
        e.g. an evaluation copy with likelihood_positions "revealed", may keep known_mask "post_step"."""
        if self.known_mask == "post_step" and self.likelihood_positions != "unknown":
            raise ValueError(
                f"known_mask: got 'post_step' with likelihood_positions {self.likelihood_positions!r}, expected "
                "likelihood_positions 'unknown' (post_step keeps only the positions still unknown after a step, "
                "and 'revealed' has none of those) or known_mask 'pre_step'"
            )

    def seed_selection_conflicts(self) -> list[str]:
        """Why generate(seed_selection=...) cannot defer seed chains under these settings (empty: it
        can): it needs seed chains that a recorded step draws past its committed tokens."""
        wanted = {
            "num_seeds": (self.num_seeds > 0, "> 0"),
            "likelihood_positions": (self.likelihood_positions == "unknown", "'unknown'"),
            "known_mask": (self.known_mask == "pre_step", "'pre_step'"),
            "seed_chains": (self.seed_chains == "step", "'step'"),
        }
        return [f"{name} {getattr(self, name)!r} (expected {want})" for name, (ok, want) in wanted.items() if not ok]

    def generation_only(self) -> "RolloutConfig":
        """The same sampling policy recording nothing (no seed chains, no transitions): the cheapest
        rollout, for sampling and evaluation."""
        return dataclasses.replace(self, num_seeds=0, record_mask_steps=0, record_diffusion_steps=1, likelihood_positions="revealed")

    def compiles_head(self, device: torch.device) -> bool:
        """Whether a rollout on `device` runs the head's step output compiled (compile_head)."""
        if self.compile_head == "auto":
            return torch.device(device).type == "cuda" and not self.cuda_graph
        return self.compile_head

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0

    def cfg_scale_at(self, revealed_after: int, num_tokens: int) -> float:
        """The guidance scale of a mask step after which `revealed_after` of `num_tokens` are known."""
        if self.cfg_schedule == "constant":
            return float(self.cfg_scale)
        return 1.0 + (self.cfg_scale - 1.0) * revealed_after / num_tokens


def _integer(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


# guidance scales in use are 1-10 (MAR, NOVA, Harmon); a temperature scales every std, 1 being the model's
MAX_CFG_SCALE = 100.0
MAX_TEMPERATURE = 10.0

# the valid values of each field (a RolloutConfig may be built directly, so the types are checked too)
RULES = (
    Rule("num_mask_steps", lambda v, c: _integer(v, 1), "an integer >= 1"),
    Rule("schedule", lambda v, c: v in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
    Rule("num_diffusion_steps", lambda v, c: v is None or _integer(v, 1), "null (the model's default) or an integer >= 1"),
    Rule(
        "cfg_scale",
        lambda v, c: finite(v) and 0 <= v <= MAX_CFG_SCALE,
        f"a number in [0, {MAX_CFG_SCALE:g}] (1: no guidance; 0: unconditional; larger scales saturate every image)",
    ),
    Rule("cfg_schedule", lambda v, c: v in ("constant", "linear"), "'constant' or 'linear'"),
    Rule("cfg_channels", lambda v, c: v in ("all", "eps"), "'all' or 'eps'"),
    Rule("negative_prompt", lambda v, c: v is None or isinstance(v, str), "null (the backbone's) or a string"),
    Rule(
        "temperature",
        lambda v, c: finite(v) and 0 < v <= MAX_TEMPERATURE,
        f"a number in (0, {MAX_TEMPERATURE:g}] (a larger one turns every sample into noise, which overflows)",
    ),
    Rule("num_seeds", lambda v, c: _integer(v, 0), "an integer >= 0"),
    Rule("record_mask_steps", lambda v, c: _integer(v, 0), "an integer >= 0 (0: record nothing)"),
    Rule("record_diffusion_steps", lambda v, c: _integer(v, 1), "an integer >= 1"),
    Rule("likelihood_positions", lambda v, c: v in ("revealed", "unknown"), "'revealed' or 'unknown'"),
    Rule("known_mask", lambda v, c: v in ("pre_step", "post_step"), "'pre_step' or 'post_step'"),
    Rule(
        "seed_chains",
        lambda v, c: v == "step" or (v == "commit" and c.known_mask == "pre_step"),
        "'step', or 'commit' with known_mask 'pre_step'",
    ),
    Rule(
        "cuda_graph",
        lambda v, c: v is False or (v is True and torch.cuda.is_available()),
        "false, or true on a machine with CUDA (CUDA graphs capture CUDA kernels; the rollout must run there too: run.device cuda)",
    ),
    Rule(
        "compile_head",
        lambda v, c: v == "auto" or v is False or (v is True and c.cuda_graph is False),
        "true, false or 'auto' (auto: compiled on CUDA unless cuda_graph is on; "
        "true needs cuda_graph false: a captured chain is not compiled)",
    ),
)
