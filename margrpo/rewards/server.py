"""`margrpo serve-reward`: serve reward models over HTTP so they can run on other GPUs or hosts.

    margrpo serve-reward --reward hps --reward aesthetic --option hps.device=cuda:1 --port 8765
    margrpo serve-reward --config rewards.yaml        # {name: {reward: ..., option: value, ...}}

Binds 127.0.0.1 (loopback) unless --host says otherwise; another host prints a warning at start, as
anyone who reaches the port can use the reward models: set a token then. Endpoints: GET /health ->
{"rewards": [...]}; POST /score/<name> with a wire.py request -> wire.py scores. Each reward scores
one batch at a time (a lock per reward); different rewards serve concurrently.

Limits (each a flag):
  --token TOKEN          POST requests need `Authorization: Bearer TOKEN` (401 otherwise); default
                         $MARGRPO_REWARD_TOKEN, which RemoteReward also sends (the environment keeps
                         the token out of `ps`). GET /health stays open, for liveness probes.
  --max-body-mb MB       request bodies over MB MiB get 413 (default 256: 64 images of 1024x1024 as uint8).
  --max-concurrent N     requests read and scored at once (default 32); one more gets 503 at once
                         rather than queueing, and RemoteReward retries it with backoff like any 5xx.
  --read-timeout SEC     a socket read waiting longer than SEC (default 30) ends the request (408) and
                         the connection, so that stalled uploads and idle connections free their thread.
A malformed request (bad Content-Length, payload, or an image without pixels) gets 400, which the
client does not retry.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import yaml

from .base import Reward
from .registry import build_reward
from .wire import CONTENT_TYPE, TOKEN_ENV, PayloadError, decode_request, encode_scores

DEFAULT_MAX_BODY_BYTES = 256 << 20
DEFAULT_MAX_CONCURRENT = 32
DEFAULT_READ_TIMEOUT = 30.0


class RewardServer:
    """An HTTP server for `rewards` (name -> Reward). start() serves in a background thread.

    max_body_bytes, max_concurrent, read_timeout (seconds) and token (None: no authentication) are
    the limits of the module docstring.
    """

    def __init__(
        self,
        rewards: Mapping[str, Reward],
        host: str = "127.0.0.1",
        port: int = 8765,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        token: str | None = None,
    ) -> None:
        if not rewards:
            raise ValueError("rewards: got none, expected at least one reward to serve")
        if max_body_bytes < 1 or max_concurrent < 1 or not read_timeout > 0:
            raise ValueError(
                f"max_body_bytes/max_concurrent/read_timeout: got {max_body_bytes}/{max_concurrent}/"
                f"{read_timeout}, expected >= 1 / >= 1 / > 0"
            )
        self.rewards = dict(rewards)
        self.locks = {name: threading.Lock() for name in self.rewards}
        self.max_body_bytes, self.max_concurrent, self.read_timeout = max_body_bytes, max_concurrent, read_timeout
        self.token = token or None
        self.slots = threading.BoundedSemaphore(max_concurrent)
        self.httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = cast("tuple[str, int]", self.httpd.server_address[:2])  # TCP: (host, port), never bytes
        return f"http://{host}:{port}"

    def start(self) -> "RewardServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        # constant-time comparison: the reply time must not tell how much of a guess was right
        return hmac.compare_digest((header or "").encode(), f"Bearer {self.token}".encode())

    def score(self, name: str, body: bytes) -> bytes:
        images, prompts, metadata = decode_request(body)
        with self.locks[name]:
            scores = self.rewards[name](images, prompts, metadata)
        return encode_scores(scores)


def non_loopback_warning(host: str, token: str | None) -> str | None:
    """The warning to print when binding `host` exposes the server beyond this machine, else None."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or "" (every interface)
        loopback = False
    if loopback:
        return None
    advice = (
        "requests need the token, but travel unencrypted (plain HTTP): keep the port on a trusted network"
        if token
        else f"anyone who reaches the port can use the reward models: --token (or ${TOKEN_ENV}) is advised"
    )
    return f"margrpo serve-reward: warning: binding {host or 'every interface'!r}, not loopback; {advice}"


def _content_length(value: str | None) -> int | None:
    """The body length a Content-Length header declares, None unless a positive decimal integer."""
    digits = (value or "").strip()
    if not (digits.isascii() and digits.isdigit()):  # int() would also take "+5", "-1", "5_0"
        return None
    length = int(digits)
    return length if length > 0 else None


def _error_reply(status: int, message: str) -> tuple[int, bytes, str]:
    return status, json.dumps({"error": message}).encode(), "application/json"


def _handler_for(server: RewardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = server.read_timeout  # socket timeout: a stalled read raises TimeoutError

        def log_message(self, format: str, *args: Any) -> None:  # keep training logs quiet
            pass

        def _reply(self, status: int, body: bytes, content_type: str = CONTENT_TYPE) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                self.close_connection = True  # the client gave up (timeout): nobody to answer

        def _error(self, status: int, message: str) -> None:
            self._reply(*_error_reply(status, message))

        def _refuse(self, status: int, message: str, length: int) -> None:
            """Reply `status` without reading the body, then close. The unread body is first read and
            dropped (for at most read_timeout seconds): closing a socket with unread data resets the
            connection, and the client, still sending, would see the reset instead of the reply."""
            self.close_connection = True
            self._error(status, message)
            deadline = time.monotonic() + server.read_timeout
            try:
                while length > 0 and time.monotonic() < deadline:
                    chunk = self.rfile.read1(min(length, 1 << 16))
                    if not chunk:
                        break
                    length -= len(chunk)
            except OSError:  # timed out or reset: the connection closes anyway
                pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._reply(200, json.dumps({"rewards": sorted(server.rewards)}).encode(), "application/json")
            else:
                self._error(404, f"path {self.path!r}: expected GET /health or POST /score/<reward>")

        def do_POST(self) -> None:
            header = self.headers.get("Content-Length")
            length = _content_length(header)
            if length is None:
                self.close_connection = True  # where the body ends is unknown: the connection is unusable
                self._error(400, f"Content-Length: got {header!r}, expected a positive integer")
                return
            prefix = "/score/"
            name = self.path[len(prefix) :] if self.path.startswith(prefix) else None
            if not server.authorized(self.headers.get("Authorization")):
                self._refuse(401, "Authorization: expected 'Bearer <token>' with the server's token", length)
            elif name not in server.rewards:
                self._refuse(404, f"reward {name!r} is not served here; serving: {', '.join(sorted(server.rewards))}", length)
            elif length > server.max_body_bytes:
                self._refuse(
                    413, f"Content-Length: got {length}, expected at most {server.max_body_bytes} (the server's --max-body-mb)", length
                )
            elif not server.slots.acquire(blocking=False):
                self._refuse(
                    503, f"busy: {server.max_concurrent} requests in progress (the server's --max-concurrent); retry later", length
                )
            else:
                try:
                    reply = self._score(name, length)
                finally:
                    # before replying: a client that has its reply may send its next request at once
                    server.slots.release()
                if reply is not None:
                    self._reply(*reply)

        def _score(self, name: str, length: int) -> tuple[int, bytes, str] | None:
            """Reads the body and scores it: the reply (status, body, content type), None if the client left."""
            try:
                body = self.rfile.read(length)
            except TimeoutError:
                self.close_connection = True
                return _error_reply(408, f"body: no data for {server.read_timeout}s (the server's --read-timeout)")
            if len(body) < length:  # the client closed the connection mid-upload
                self.close_connection = True
                return None
            try:
                return 200, server.score(name, body), CONTENT_TYPE
            except (PayloadError, ValueError, TypeError) as err:
                return _error_reply(400, str(err))
            except Exception as err:  # the reward failed: the client may retry
                return _error_reply(500, f"{type(err).__name__}: {err}")

    return Handler


def _parse_value(text: str) -> Any:
    return yaml.safe_load(text)


def rewards_from_args(args: argparse.Namespace) -> dict[str, Reward]:
    """Build the served rewards from --config, --reward and --option arguments."""
    spec: dict[str, dict[str, Any]] = {}
    if args.config:
        with open(args.config) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {args.config}: expected a mapping of reward name -> options")
        spec.update({name: dict(opts or {}) for name, opts in loaded.items()})
    for name in args.reward:
        spec.setdefault(name, {})
    for item in args.option:
        key, sep, value = item.partition("=")
        name, dot, option = key.partition(".")
        if not sep or not dot or name not in spec:
            raise ValueError(f"--option {item!r}: expected NAME.KEY=VALUE with NAME one of {sorted(spec)}")
        spec[name][option] = _parse_value(value)
    if not spec:
        raise ValueError("serve-reward: no reward given; use --reward NAME or --config FILE")
    rewards = {}
    for name, options in spec.items():
        options = dict(options)
        options.pop("weight", None)  # a training config entry may carry its weight: not the server's business
        rewards[name] = build_reward(options.pop("reward", name), **options)
    return rewards


def _positive(kind: type) -> Any:
    """An argparse type: a number of `kind` > 0 (checked before the rewards load, which may take minutes)."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"got {text}, expected a number > 0")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    """Entry point of `margrpo serve-reward`."""
    parser = argparse.ArgumentParser(prog="margrpo serve-reward", description=__doc__.split("\n")[0])
    parser.add_argument("--reward", action="append", default=[], help="a reward to serve (repeatable)")
    parser.add_argument("--option", action="append", default=[], help="NAME.KEY=VALUE reward option (repeatable)")
    parser.add_argument("--config", help="YAML mapping: name -> options (optional key 'reward' picks the type)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; another one prints a warning: use --token)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"shared token POST requests must send as 'Authorization: Bearer TOKEN' (default ${TOKEN_ENV}; unset: no authentication)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=_positive(float),
        default=DEFAULT_MAX_BODY_BYTES / (1 << 20),
        help="largest request body in MiB; larger ones get 413 (default %(default)g)",
    )
    parser.add_argument(
        "--max-concurrent",
        type=_positive(int),
        default=DEFAULT_MAX_CONCURRENT,
        help="requests read and scored at once; more get 503 (default %(default)s)",
    )
    parser.add_argument(
        "--read-timeout",
        type=_positive(float),
        default=DEFAULT_READ_TIMEOUT,
        help="seconds a socket read may wait for data before the connection is dropped (default %(default)g)",
    )
    args = parser.parse_args(argv)
    try:
        rewards = rewards_from_args(args)
    except (ValueError, KeyError) as err:  # a usage mistake: say it like argparse does
        parser.error(str(err))
    warning = non_loopback_warning(args.host, args.token)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    max_body_bytes = max(1, int(args.max_body_mb * (1 << 20)))
    server = RewardServer(
        rewards,
        host=args.host,
        port=args.port,
        max_body_bytes=max_body_bytes,
        max_concurrent=args.max_concurrent,
        read_timeout=args.read_timeout,
        token=args.token,
    )
    print(f"margrpo serve-reward: serving {', '.join(sorted(server.rewards))} at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0
