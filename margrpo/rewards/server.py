"""`margrpo serve-reward`: serve reward models over HTTP so they can run on other GPUs or hosts.

    margrpo serve-reward --reward hps --reward aesthetic --option hps.device=cuda:1 --port 8765
    margrpo serve-reward --config rewards.yaml        # {name: {reward: ..., option: value, ...}}

Binds 127.0.0.1 (loopback) unless --host says otherwise. Endpoints: GET /health -> {"rewards": [...]};
POST /score/<name> with a wire.py request -> wire.py scores. Each reward scores one batch at a time
(a lock per reward); different rewards serve concurrently.
"""
from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

from .base import Reward
from .registry import build_reward
from .wire import CONTENT_TYPE, PayloadError, decode_request, encode_scores

MAX_BODY_BYTES = 1 << 30


class RewardServer:
    """An HTTP server for `rewards` (name -> Reward). start() serves in a background thread."""

    def __init__(self, rewards: Mapping[str, Reward], host: str = "127.0.0.1", port: int = 8765) -> None:
        if not rewards:
            raise ValueError("rewards: got none, expected at least one reward to serve")
        self.rewards = dict(rewards)
        self.locks = {name: threading.Lock() for name in self.rewards}
        self.httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
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

    def score(self, name: str, body: bytes) -> bytes:
        images, prompts, metadata = decode_request(body)
        with self.locks[name]:
            scores = self.rewards[name](images, prompts, metadata)
        return encode_scores(scores)


def _handler_for(server: RewardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep training logs quiet
            pass

        def _reply(self, status: int, body: bytes, content_type: str = CONTENT_TYPE) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (timeout): nobody to answer

        def _error(self, status: int, message: str) -> None:
            self._reply(status, json.dumps({"error": message}).encode(), "application/json")

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._reply(200, json.dumps({"rewards": sorted(server.rewards)}).encode(), "application/json")
            else:
                self._error(404, f"path {self.path!r}: expected GET /health or POST /score/<reward>")

        def do_POST(self) -> None:
            prefix = "/score/"
            name = self.path[len(prefix):] if self.path.startswith(prefix) else None
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                self._error(413 if length else 411, f"Content-Length: got {length}, expected 1..{MAX_BODY_BYTES}")
                return
            body = self.rfile.read(length)
            if name not in server.rewards:
                self._error(404, f"reward {name!r} is not served here; serving: {', '.join(sorted(server.rewards))}")
                return
            try:
                reply = server.score(name, body)
            except (PayloadError, ValueError, TypeError) as err:
                self._error(400, str(err))
            except Exception as err:  # the reward failed: the client may retry
                self._error(500, f"{type(err).__name__}: {err}")
            else:
                self._reply(200, reply)

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


def main(argv: list[str] | None = None) -> int:
    """Entry point of `margrpo serve-reward`."""
    parser = argparse.ArgumentParser(prog="margrpo serve-reward", description=__doc__.split("\n")[0])
    parser.add_argument("--reward", action="append", default=[], help="a reward to serve (repeatable)")
    parser.add_argument("--option", action="append", default=[], help="NAME.KEY=VALUE reward option (repeatable)")
    parser.add_argument("--config", help="YAML mapping: name -> options (optional key 'reward' picks the type)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    try:
        rewards = rewards_from_args(args)
    except (ValueError, KeyError) as err:  # a usage mistake: say it like argparse does
        parser.error(str(err))
    server = RewardServer(rewards, host=args.host, port=args.port)
    print(f"margrpo serve-reward: serving {', '.join(sorted(server.rewards))} at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0
