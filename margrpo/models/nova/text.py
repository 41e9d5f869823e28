"""NOVA's frozen text encoder: the checkpoint's tokenizer/ and text_encoder/ (Phi-2) through transformers.

Upstream pads every prompt to text_token_len tokens, runs Phi and keeps the states of the prompt's
own tokens (the rest of the 256 positions take text_embed.weight rows). Phi is causal, so a
prompt's states do not depend on what follows it: here prompts are padded only to the longest one
in the batch, with the same result. The empty prompt (NOVA's negative prompt) has no tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch


class PhiTextEncoder:
    """Tokenizer + Phi model -> last hidden states per prompt. Frozen: runs without gradient."""

    def __init__(self, tokenizer, model, max_tokens: int):
        self.tokenizer, self.model, self.max_tokens = tokenizer, model.eval().requires_grad_(False), max_tokens

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @torch.no_grad()
    def __call__(self, prompts: list[str]) -> list[torch.Tensor]:
        """prompts -> per prompt the states of its tokens [n_i, hidden] (n_i <= max_tokens)."""
        ids = [self.tokenizer(p, max_length=self.max_tokens, truncation=True)["input_ids"] for p in prompts]
        longest = max(len(i) for i in ids)
        device = self.model.get_input_embeddings().weight.device
        if longest == 0:
            empty = torch.zeros(0, self.hidden_size, device=device, dtype=self.model.dtype)
            return [empty for _ in prompts]
        pad = self.tokenizer.pad_token_id or 0  # never attended to by the prompt's own (causal) tokens
        batch = torch.tensor([i + [pad] * (longest - len(i)) for i in ids], device=device)
        states = self.model(input_ids=batch).last_hidden_state
        return [states[row, : len(i)] for row, i in enumerate(ids)]


def load_text_encoder(tokenizer_dir: Path, encoder_dir: Path, max_tokens: int, device, dtype: torch.dtype) -> PhiTextEncoder:
    """The tokenizer and Phi model of a NOVA checkpoint (Phi weights may carry the upstream
    "model." prefix and an lm_head, which is dropped). Missing weights raise ValueError."""
    from transformers import AutoTokenizer, PhiModel
    from transformers.utils import logging

    # quiet: the load report lists lm_head as unexpected (expected here), and a progress bar
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        model, info = PhiModel.from_pretrained(str(encoder_dir), dtype=dtype, output_loading_info=True)
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
    unexpected = sorted(k for k in info["unexpected_keys"] if not k.startswith("lm_head."))
    problems = [
        f"{name} {sorted(info[key])[:8]}" for name, key in (("missing", "missing_keys"), ("mismatched", "mismatched_keys")) if info[key]
    ]
    if unexpected:
        problems.append(f"unexpected {unexpected[:8]}")
    if problems:
        raise ValueError(f"{encoder_dir}: the Phi weights do not fit its config.json: " + "; ".join(problems))
    # explicit cast: transformers before 4.56 named the from_pretrained keyword torch_dtype
    return PhiTextEncoder(tokenizer, model.to(device=device, dtype=dtype), max_tokens)
