"""RemoteReward: a reward scored by a `margrpo serve-reward` process (another GPU or machine).

Each call POSTs one compact batch (wire.py) to {url}/score/{remote_name}. Connection errors,
timeouts and 5xx replies are retried `retries` times with exponential backoff (backoff, 2*backoff,
...); a 4xx reply (bad payload, unknown reward) fails at once. Failures raise RewardServiceError
naming the URL, the attempts and the last error. With a token (the `token` option, else
$MARGRPO_REWARD_TOKEN) each request carries `Authorization: Bearer <token>` for a server started
with --token.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import torch

from .base import Metadata, Reward
from .registry import register
from .wire import CONTENT_TYPE, TOKEN_ENV, decode_scores, encode_request


class RewardServiceError(RuntimeError):
    """The reward service could not score a batch."""


@register("remote")
class RemoteReward(Reward):
    """Scores from a reward server.

    Args:
        url: the server, e.g. http://127.0.0.1:8765.
        remote_name: the reward's name on the server (as given to `margrpo serve-reward --reward`).
        timeout: seconds to wait for one reply. retries: extra attempts after a failure.
        backoff: seconds before the first retry (doubles each time).
        wire_dtype: 'uint8' (compact; images quantised to 1/255) or 'float16'.
        token: the server's shared token (its --token); None: $MARGRPO_REWARD_TOKEN if set, else none.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8765",
        remote_name: str = "hps",
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 1.0,
        wire_dtype: str = "uint8",
        device: str | None = "cpu",
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError(f"timeout/retries/backoff: got {timeout}/{retries}/{backoff}, expected >0 / >=0 / >=0")
        self.url, self.remote_name = url.rstrip("/"), remote_name
        self.timeout, self.retries, self.backoff, self.wire_dtype = timeout, retries, backoff, wire_dtype
        self.token = token or os.environ.get(TOKEN_ENV) or None

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        body = encode_request(images, prompts, metadata, self.wire_dtype)
        endpoint = f"{self.url}/score/{self.remote_name}"
        headers = {"Content-Type": CONTENT_TYPE}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(endpoint, data=body, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                    return decode_scores(reply.read(), len(prompts)).to(self.device)
            except urllib.error.HTTPError as err:
                last_error = f"HTTP {err.code}: {_error_message(err)}"
                if err.code < 500:  # the request itself is wrong: retrying cannot help
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                last_error = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        raise RewardServiceError(
            f"reward service {endpoint}: failed after {attempt + 1} attempt(s) (timeout {self.timeout}s each); last error: {last_error}"
        )


def _error_message(err: urllib.error.HTTPError) -> str:
    try:
        return json.loads(err.read())["error"]
    except Exception:
        return err.reason or "no message"
