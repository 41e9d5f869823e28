"""Deprecated name of margrpo.heads.upstream (the upstream-style eager sampling loops)."""

from .upstream import eager_denoise_logprob, eager_multi_seed_denoise

__all__ = ["eager_denoise_logprob", "eager_multi_seed_denoise"]
