"""GIT VQA reward: the probability that a VQA model answers "yes" to questions about the image.

For each question q the score is P(yes) / (P(yes) + P(no)) of the next token after
"[CLS] q" (GIT's VQA format, microsoft/git-large-vqav2); an image's score is the mean over its
questions. Questions, per image (compbench.py metadata, the T2I-R1 / MAR-GRPO rule):
  - spatial and numeracy tasks: not scored here (0; GroundingDINO scores them);
  - else "{phrase}?" for each attr_nouns phrase, or each noun when there are no attr_nouns;
  - no nouns and no attr_nouns: no_nouns='one' (default, the MAR-GRPO reference) scores 1 without
    asking; no_nouns='ask_prompt' asks about the prompt itself, "{prompt}?", so that plain prompts
    without metadata still get an image-dependent score.
With no_nouns='one' a call without any metadata is refused (MissingMetadataError): every image would
score 1.
The reference falls back to the nouns only when attr_nouns is absent (None); an empty attr_nouns
list makes its mean over no questions NaN. Here an empty list counts as absent.
All questions of a batch run as one padded batch (right padding; the text is causal, so padding
does not change the logits read at each row's last real token).
"""

from __future__ import annotations

import torch

from .base import Metadata, Reward
from .compbench import CompBenchItem
from .preprocess import ImageTransform
from .registry import register
from .weights import CorruptWeightsError, WeightsSpec, load_hf_model, require_files, resolve

SPEC = WeightsSpec(
    "git_vqa",
    "git-large-vqav2",
    "a Hugging Face GIT directory: config.json, model.safetensors or pytorch_model.bin, "
    "tokenizer files (vocab.txt) and preprocessor_config.json",
    "https://huggingface.co/microsoft/git-large-vqav2",
)
UNSCORED_TASKS = ("spatial", "numeracy")
NO_NOUNS = ("one", "ask_prompt")


def questions_for(item: CompBenchItem, prompt: str, no_nouns: str = "one") -> list[str] | None:
    """The questions to ask about one image: None when VQA does not score its task (score 0), []
    when there is nothing to ask (score 1)."""
    if item.task_type in UNSCORED_TASKS:
        return None
    phrases = item.attr_nouns if item.attr_nouns else item.nouns
    if phrases:
        return [f"{p}?" for p in phrases]
    return [f"{prompt.rstrip('.?! ')}?"] if no_nouns == "ask_prompt" else []


@register("git_vqa")
class GitVQAReward(Reward):
    """Mean P(yes)/(P(yes)+P(no)) over an image's questions. path: the GIT VQA directory;
    no_nouns: 'one' (the reference) or 'ask_prompt' (see the module docstring)."""

    def __init__(
        self,
        path: str | None = None,
        no_nouns: str = "one",
        device: str | None = None,
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if no_nouns not in NO_NOUNS:
            raise ValueError(f"no_nouns: got {no_nouns!r}, expected one of {', '.join(NO_NOUNS)}")
        self.no_nouns = no_nouns
        self.needs_metadata = no_nouns == "one"  # 'ask_prompt' scores plain prompts too
        directory = resolve(SPEC, path, kind="dir")
        require_files(SPEC, directory, ["preprocessor_config.json", ("tokenizer.json", "vocab.txt")])
        from transformers import AutoTokenizer, GitForCausalLM  # the rewards extra; needed from here on

        self.model = load_hf_model(SPEC, GitForCausalLM, directory).to(self.device, self.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.transform = ImageTransform.from_hf_config(directory / "preprocessor_config.json")
        ids = {word: self.tokenizer.encode(word, add_special_tokens=False) for word in ("yes", "no")}
        if any(len(v) != 1 for v in ids.values()):
            raise CorruptWeightsError(
                f"git_vqa: the tokenizer in {directory} does not hold 'yes' and 'no' as single tokens (got {ids}); {SPEC.describe()}"
            )
        self.yes_id, self.no_id = ids["yes"][0], ids["no"][0]

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        items = [CompBenchItem.from_metadata(m, i) for i, m in enumerate(metadata)]
        asked = [questions_for(item, prompt, self.no_nouns) for item, prompt in zip(items, prompts)]
        rows = [(i, q) for i, qs in enumerate(asked) if qs for q in qs]
        # unscored tasks 0, nothing to ask 1; asked images are overwritten with their mean below
        scores = torch.tensor([0.0 if qs is None else 1.0 for qs in asked], device=self.device)
        if not rows:
            return scores
        image_index = torch.tensor([i for i, _ in rows], device=self.device)
        pixels = self.transform(images, self.dtype)[image_index]
        encoded = [[self.tokenizer.cls_token_id] + self.tokenizer.encode(q, add_special_tokens=False) for _, q in rows]
        lengths = torch.tensor([len(e) for e in encoded], device=self.device)
        input_ids = torch.full((len(rows), int(lengths.max())), self.tokenizer.pad_token_id or 0, device=self.device)
        for r, e in enumerate(encoded):
            input_ids[r, : len(e)] = torch.tensor(e, device=self.device)
        mask = (torch.arange(input_ids.shape[1], device=self.device) < lengths[:, None]).long()
        logits = self.model(pixel_values=pixels, input_ids=input_ids, attention_mask=mask).logits
        image_tokens = logits.shape[1] - input_ids.shape[1]  # GIT's logits cover the image tokens first
        last = logits[torch.arange(len(rows), device=self.device), image_tokens + lengths - 1].float()
        # P(yes)/(P(yes)+P(no)) = sigmoid(logit_yes - logit_no): the softmax normaliser cancels
        p_yes = torch.sigmoid(last[:, self.yes_id] - last[:, self.no_id])
        total = torch.zeros(len(prompts), device=self.device).index_add_(0, image_index, p_yes)
        count = torch.zeros(len(prompts), device=self.device).index_add_(0, image_index, torch.ones_like(p_yes))
        return torch.where(count > 0, total / count.clamp(min=1), scores)
