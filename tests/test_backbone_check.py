"""The MARBackbone protocol is checked where a backbone is passed in (generate, rollout_logprob,
load_backbone, the trainer): an error that names the missing member, before any work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from margrpo.diffusion import mar_sampler
from margrpo.heads import SimpleMLPAdaLN
from margrpo.models import BackboneConfig, load_backbone, register_backbone, registry
from margrpo.models.base import MARBackbone, PromptBatch, check_backbone
from margrpo.rollout import RolloutConfig, generate

C, DZ = 4, 8


class ToyMAR(nn.Module):
    """A complete backbone: z from the prompt's length, the position and the known canvas."""

    num_tokens, token_channels = 4, C

    def __init__(self):
        super().__init__()
        self.head = SimpleMLPAdaLN(C, 16, 2 * C, DZ, 1)
        self.position = nn.Parameter(torch.randn(self.num_tokens, DZ))
        self.mix = nn.Linear(C + 1, DZ)

    def encode_prompts(self, prompts):
        return PromptBatch(torch.ones(len(prompts), 1, DZ), torch.ones(len(prompts), 1, dtype=torch.bool))

    def negative_prompt(self):
        return ""

    def forward_z(self, prompts, canvas, known, known_count=None):
        return self.position + self.mix(torch.cat([canvas * known[..., None], known[..., None].float()], -1))

    def decode(self, tokens):
        return torch.sigmoid(tokens[..., :3]).transpose(1, 2).reshape(-1, 3, 2, 2)

    def make_sampler(self, num_steps=None):
        return mar_sampler(num_steps or 4)

    def trainable_parameters(self):
        return [self.position, *self.mix.parameters()]


class NoDecode(ToyMAR):
    decode = None  # as if the method were never written


class OldForwardZ(ToyMAR):
    def forward_z(self, prompts, canvas, mask):  # MAR's naming: mask is the inverse of known
        return super().forward_z(prompts, canvas, ~mask)


CONFIG = RolloutConfig(num_mask_steps=2, schedule="harmon", record_mask_steps=1, record_diffusion_steps=1)


def test_a_complete_backbone_passes_and_generates():
    model = ToyMAR()
    assert isinstance(model, MARBackbone) and check_backbone(model) is model
    assert generate(model, ["a", "b"], CONFIG, [0, 1]).images.shape == (2, 3, 2, 2)


@pytest.mark.parametrize(
    "cls, named",
    [(NoDecode, "decode: got NoneType, expected a method"), (OldForwardZ, r"forward_z: got parameters \(prompts, canvas, mask\)")],
)
def test_generate_names_the_member_before_any_work(cls, named):
    model = cls()
    calls = []
    model.encode_prompts = lambda prompts: calls.append(prompts)  # nothing may run before the check
    with pytest.raises(TypeError, match=f"backbone: {cls.__name__} does not implement margrpo.models.MARBackbone: {named}"):
        generate(model, ["a", "b"], CONFIG, [0, 1])
    assert calls == []


def test_a_missing_attribute_and_a_head_that_is_no_diffusion_head_are_named():
    model = ToyMAR()
    del ToyMAR.num_tokens  # class attribute: restored below
    try:
        with pytest.raises(TypeError, match="num_tokens: missing"):
            check_backbone(model, "policy")
    finally:
        ToyMAR.num_tokens = 4
    model = ToyMAR()
    model.head = nn.Linear(C, C)  # a raw module: margrpo.heads.adapt makes a DiffusionHead of a real one
    with pytest.raises(TypeError, match="head.denoise: missing.*margrpo.heads.adapt"):
        check_backbone(model)


def test_load_backbone_checks_what_the_loader_returns(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_LOADERS", dict(registry._LOADERS))  # the registration ends with the test
    register_backbone("test-no-decode", lambda checkpoint, **kwargs: NoDecode())
    with pytest.raises(TypeError, match="backbone.name 'test-no-decode': NoDecode does not implement"):
        load_backbone(BackboneConfig(name="test-no-decode", checkpoint=str(tmp_path)))
