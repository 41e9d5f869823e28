"""The reward service on loopback: round trip, compact payloads, timeouts, server down, bad payloads,
and the server's limits (body size, concurrency, read timeout, token)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from margrpo.rewards import RemoteReward, RewardServiceError, build_reward
from margrpo.rewards.base import Reward
from margrpo.rewards.server import RewardServer, main, non_loopback_warning, rewards_from_args
from margrpo.rewards.wire import PayloadError, decode_request, encode_request


class MeanPixel(Reward):
    """Exact test reward: mean pixel value plus the prompt length plus metadata['bonus']."""

    name = "mean_pixel"

    def __init__(self):
        super().__init__(device="cpu")

    def score(self, images, prompts, metadata):
        bonus = torch.tensor([float(m.get("bonus", 0)) for m in metadata])
        return images.double().mean((1, 2, 3)) + torch.tensor([len(p) for p in prompts]) + bonus


class Slow(MeanPixel):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def score(self, images, prompts, metadata):
        time.sleep(self.seconds)
        return super().score(images, prompts, metadata)


class Broken(MeanPixel):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def score(self, images, prompts, metadata):
        self.calls += 1
        raise RuntimeError("boom")


@pytest.fixture(scope="module")
def server():
    broken = Broken()
    srv = RewardServer(
        {"mean_pixel": MeanPixel(), "slow": Slow(1.0), "broken": broken, "jpeg": build_reward("jpeg_incompressibility", device="cpu")},
        port=0,
    ).start()
    srv.broken = broken
    yield srv
    srv.stop()


def images_u8(batch=3, h=16, w=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, h, w), generator=g, dtype=torch.uint8)


def test_binds_loopback_and_reports_health(server):
    assert server.url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(f"{server.url}/health", timeout=5) as reply:
        assert json.loads(reply.read()) == {"rewards": ["broken", "jpeg", "mean_pixel", "slow"]}


@pytest.mark.parametrize("wire_dtype, atol", [("uint8", 0.0), ("float16", 1e-3)])
def test_round_trip_equals_local_scores(server, wire_dtype, atol):
    images = images_u8()
    prompts, metadata = ["a", "bb", "ccc"], [{"bonus": 1}, {}, {"bonus": 2.5}]
    remote = RemoteReward(url=server.url, remote_name="mean_pixel", timeout=5, retries=0, wire_dtype=wire_dtype)
    local = MeanPixel()(images, prompts, metadata)
    torch.testing.assert_close(remote(images, prompts, metadata), local, rtol=0, atol=atol)
    jpeg = RemoteReward(url=server.url, remote_name="jpeg", timeout=5, retries=0)
    torch.testing.assert_close(jpeg(images, prompts), build_reward("jpeg_incompressibility", device="cpu")(images, prompts))


def test_remote_reward_is_buildable_from_a_config(server):
    remote = build_reward("remote", url=server.url, remote_name="mean_pixel", timeout=5, retries=0)
    images = images_u8(batch=2)
    torch.testing.assert_close(remote(images, ["x", "y"]), MeanPixel()(images, ["x", "y"]))


def test_payload_is_compact_tensors_not_per_image_pngs():
    images = images_u8(batch=4, h=64, w=64)
    body = encode_request(images.float() / 255, ["p"] * 4, None)
    assert len(body) < images.numel() + 512  # one uint8 per channel value plus a small header
    decoded, prompts, metadata = decode_request(body)
    assert torch.equal(decoded, images) and prompts == ["p"] * 4 and metadata is None


def test_timeout_retries_with_backoff_then_fails_clearly(server):
    remote = RemoteReward(url=server.url, remote_name="slow", timeout=0.2, retries=2, backoff=0.05)
    start = time.monotonic()
    with pytest.raises(RewardServiceError) as err:
        remote(images_u8(batch=1), ["p"])
    elapsed = time.monotonic() - start
    text = str(err.value)
    assert "failed after 3 attempt(s)" in text and "timeout 0.2s" in text and "/score/slow" in text
    assert 3 * 0.2 + 0.05 + 0.1 <= elapsed < 5  # three timeouts plus the two backoff sleeps


def test_server_down_fails_after_retries():
    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteReward(url=f"http://127.0.0.1:{port}", remote_name="x", timeout=1, retries=1, backoff=0.01)
    with pytest.raises(RewardServiceError, match=r"failed after 2 attempt\(s\).*(refused|URLError)"):
        remote(images_u8(batch=1), ["p"])


def test_server_side_failure_is_retried_then_reported(server):
    before = server.broken.calls
    remote = RemoteReward(url=server.url, remote_name="broken", timeout=5, retries=1, backoff=0.01)
    with pytest.raises(RewardServiceError, match=r"failed after 2 attempt\(s\).*HTTP 500: RuntimeError: boom"):
        remote(images_u8(batch=1), ["p"])
    assert server.broken.calls == before + 2


def test_unknown_reward_fails_at_once_without_retries(server):
    remote = RemoteReward(url=server.url, remote_name="nope", timeout=5, retries=3, backoff=1.0)
    start = time.monotonic()
    with pytest.raises(RewardServiceError, match=r"failed after 1 attempt\(s\).*HTTP 404: reward 'nope' is not served"):
        remote(images_u8(batch=1), ["p"])
    assert time.monotonic() - start < 1.0  # no backoff sleep for a 4xx


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, {}
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_bad_payloads_get_400_with_a_message(server):
    code, reply = _post(f"{server.url}/score/mean_pixel", b"definitely not safetensors")
    assert code == 400 and "not a reward request" in reply["error"]
    mismatched = encode_request(images_u8(batch=2).float() / 255, ["only one"], None)
    code, reply = _post(f"{server.url}/score/mean_pixel", mismatched)
    assert code == 400 and "prompts: got 1 prompts, expected a list of 2" in reply["error"]
    from safetensors.torch import save

    wrong_shape = save({"images": torch.zeros(2, 4, 4, dtype=torch.uint8)}, metadata={"prompts": "[]", "metadata": "null"})
    code, reply = _post(f"{server.url}/score/mean_pixel", wrong_shape)
    assert code == 400 and "images: got torch.uint8 (2, 4, 4)" in reply["error"]
    with pytest.raises(PayloadError, match="prompts: expected a JSON list of strings"):
        decode_request(save({"images": torch.zeros(1, 3, 2, 2, dtype=torch.uint8)}, metadata={"prompts": "[1]", "metadata": "null"}))


def test_concurrent_clients_get_their_own_scores(server):
    results, errors = {}, []

    def work(i):
        try:
            images = images_u8(batch=2, seed=i)
            remote = RemoteReward(url=server.url, remote_name="mean_pixel", timeout=5, retries=0)
            results[i] = torch.allclose(remote(images, ["a", "b"]), MeanPixel()(images, ["a", "b"]))
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors and results == {0: True, 1: True, 2: True, 3: True}


def test_cli_arguments_build_the_rewards(tmp_path):
    import argparse

    config = tmp_path / "rewards.yaml"
    config.write_text("small:\n  reward: jpeg_compressibility\n  quality: 40\n  weight: 2.0\n")
    args = argparse.Namespace(
        config=str(config),
        reward=["jpeg_incompressibility"],
        option=["jpeg_incompressibility.quality=70", "jpeg_incompressibility.device=cpu"],
    )
    built = rewards_from_args(args)
    assert sorted(built) == ["jpeg_incompressibility", "small"]
    assert built["small"].quality == 40 and built["jpeg_incompressibility"].quality == 70
    bad = argparse.Namespace(config=None, reward=["jpeg_compressibility"], option=["other.quality=1"])
    with pytest.raises(ValueError, match="--option 'other.quality=1': expected NAME.KEY=VALUE"):
        rewards_from_args(bad)
    with pytest.raises(SystemExit) as exit_info:
        main(["--port", "0"])  # argparse-style usage error: exit status 2
    assert exit_info.value.code == 2


# ------------------------------------------------------------------ hardening: limits, timeouts, token
class Gate(MeanPixel):
    """Scores once `release` is set; `entered` tells that a request holds a slot; counts its calls."""

    def __init__(self):
        super().__init__()
        self.entered, self.release, self.calls = threading.Event(), threading.Event(), 0

    def score(self, images, prompts, metadata):
        self.calls += 1
        self.entered.set()
        assert self.release.wait(10)
        return super().score(images, prompts, metadata)


@contextlib.contextmanager
def serving(rewards, **limits):
    srv = RewardServer(rewards, port=0, **limits).start()
    try:
        yield srv
    finally:
        srv.stop()


def raw_exchange(url: str, request: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes to the server and return everything it answers until it closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize("length", ["abc", "-5", "+5", "0", None])
def test_bad_content_length_gets_400_without_a_traceback(server, capfd, length):
    header = b"" if length is None else f"Content-Length: {length}\r\n".encode()
    reply = raw_exchange(server.url, b"POST /score/mean_pixel HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ") and b"Content-Length: got" in reply
    assert b"Connection: close" in reply  # the body's end is unknown: the connection cannot be reused
    assert "Traceback" not in capfd.readouterr().err


def test_image_without_pixels_gets_400_and_is_not_retried():
    reward = Gate()
    reward.release.set()
    with serving({"gate": reward}) as srv:
        remote = RemoteReward(url=srv.url, remote_name="gate", timeout=5, retries=3, backoff=1.0)
        start = time.monotonic()
        with pytest.raises(RewardServiceError, match=r"after 1 attempt\(s\).*HTTP 400: images: got 0x0 pixels"):
            remote(torch.zeros(1, 3, 0, 0, dtype=torch.uint8), ["p"])
        assert time.monotonic() - start < 1.0 and reward.calls == 0  # no backoff sleep, the reward never ran
        code, reply = _post(f"{srv.url}/score/gate", encode_request(torch.zeros(2, 3, 4, 0), ["a", "b"], None))
        assert code == 400 and "4x0 pixels" in reply["error"]


@pytest.mark.parametrize("height,width", [(1, 70000), (70000, 1), (8193, 300), (2, 65), (300, 9)])
def test_an_image_beyond_the_size_limits_gets_400_naming_them(server, height, width):
    """A side over MAX_IMAGE_SIDE or an aspect ratio over MAX_ASPECT fails inside a reward (a 1 x 70000
    image got a 500, which clients retry): refused before any reward runs, naming the limits."""
    from margrpo.rewards.wire import MAX_ASPECT, MAX_IMAGE_SIDE

    body = encode_request(torch.zeros(1, 3, height, width), ["p"], None)
    code, reply = _post(f"{server.url}/score/jpeg", body)
    assert code == 400, reply
    assert f"got {height}x{width} pixels" in reply["error"] and str(MAX_IMAGE_SIDE) in reply["error"]
    assert f"at most {MAX_ASPECT} times" in reply["error"]
    for h, w in [(1, MAX_ASPECT), (MAX_IMAGE_SIDE // MAX_ASPECT, MAX_IMAGE_SIDE), (MAX_ASPECT, 1)]:  # the limits
        images, _, _ = decode_request(encode_request(torch.zeros(1, 3, h, w), ["p"], None))
        assert images.shape == (1, 3, h, w)


def test_body_over_the_limit_gets_413():
    with serving({"mean_pixel": MeanPixel()}, max_body_bytes=4096) as srv:
        small = encode_request(images_u8(batch=1, h=8, w=8).float() / 255, ["p"], None)
        assert len(small) <= 4096 and _post(f"{srv.url}/score/mean_pixel", small)[0] == 200
        code, reply = _post(f"{srv.url}/score/mean_pixel", encode_request(images_u8(batch=4, h=32, w=32).float() / 255, ["p"] * 4, None))
        assert code == 413 and "expected at most 4096" in reply["error"]


def test_requests_beyond_the_concurrency_limit_get_503():
    reward = Gate()
    with serving({"gate": reward, "mean_pixel": MeanPixel()}, max_concurrent=1) as srv:
        body = encode_request(images_u8(batch=1).float() / 255, ["p"], None)
        first = {}
        holder = threading.Thread(target=lambda: first.update(code=_post(f"{srv.url}/score/gate", body)[0]))
        holder.start()
        assert reward.entered.wait(5)  # the first request holds the only slot
        code, reply = _post(f"{srv.url}/score/mean_pixel", body)
        assert code == 503 and "busy: 1 requests in progress" in reply["error"]
        reward.release.set()
        holder.join(5)
        assert first == {"code": 200}
        assert _post(f"{srv.url}/score/mean_pixel", body)[0] == 200  # the slot is free again


def test_stalled_upload_times_out_and_frees_its_slot():
    with serving({"mean_pixel": MeanPixel()}, max_concurrent=1, read_timeout=0.5) as srv:
        start = time.monotonic()
        reply = raw_exchange(
            srv.url, b"POST /score/mean_pixel HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10
        )  # 990 bytes never come
        assert reply.startswith(b"HTTP/1.1 408 ") and 0.5 <= time.monotonic() - start < 3
        start = time.monotonic()
        assert raw_exchange(srv.url, b"POST /score/mean_pixel HTTP/1.1\r\n") == b""  # stalled headers: closed
        assert 0.5 <= time.monotonic() - start < 3
        body = encode_request(images_u8(batch=1).float() / 255, ["p"], None)
        assert _post(f"{srv.url}/score/mean_pixel", body)[0] == 200


def test_token_is_required_and_accepted(monkeypatch):
    monkeypatch.delenv("MARGRPO_REWARD_TOKEN", raising=False)
    images = images_u8(batch=2)
    with serving({"mean_pixel": MeanPixel()}, token="s3cret") as srv:
        for token in (None, "wrong"):
            remote = RemoteReward(url=srv.url, remote_name="mean_pixel", timeout=5, retries=3, token=token)
            with pytest.raises(RewardServiceError, match=r"after 1 attempt\(s\).*HTTP 401: Authorization"):
                remote(images, ["a", "b"])
        remote = RemoteReward(url=srv.url, remote_name="mean_pixel", timeout=5, retries=0, token="s3cret")
        torch.testing.assert_close(remote(images, ["a", "b"]), MeanPixel()(images, ["a", "b"]))
        monkeypatch.setenv("MARGRPO_REWARD_TOKEN", "s3cret")  # the client's default
        remote = RemoteReward(url=srv.url, remote_name="mean_pixel", timeout=5, retries=0)
        torch.testing.assert_close(remote(images, ["a", "b"]), MeanPixel()(images, ["a", "b"]))
        with urllib.request.urlopen(f"{srv.url}/health", timeout=5) as reply:  # liveness probes need no token
            assert reply.status == 200


def test_non_loopback_hosts_get_a_warning():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert non_loopback_warning(host, None) is None
    for host in ("0.0.0.0", "", "::", "10.1.2.3", "reward-host"):
        warning = non_loopback_warning(host, None)
        assert "not loopback" in warning and "--token" in warning
    assert "--token" not in non_loopback_warning("0.0.0.0", "s3cret")


def test_cli_limits_reach_the_server(monkeypatch, capsys):
    created = {}

    class Stop(Exception):
        pass

    class Recording(RewardServer):
        def __init__(self, rewards, **kwargs):
            created.update(kwargs)
            raise Stop  # before binding

    monkeypatch.setattr("margrpo.rewards.server.RewardServer", Recording)
    monkeypatch.setenv("MARGRPO_REWARD_TOKEN", "from-env")
    with pytest.raises(Stop):
        main(
            [
                "--reward",
                "jpeg_incompressibility",
                "--option",
                "jpeg_incompressibility.device=cpu",
                "--port",
                "0",
                "--max-body-mb",
                "2",
                "--max-concurrent",
                "3",
                "--read-timeout",
                "0.5",
                "--host",
                "0.0.0.0",
            ]
        )
    assert created == {
        "host": "0.0.0.0",
        "port": 0,
        "max_body_bytes": 2 << 20,
        "max_concurrent": 3,
        "read_timeout": 0.5,
        "token": "from-env",
    }
    assert "warning: binding '0.0.0.0', not loopback" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--reward", "jpeg_incompressibility", "--max-concurrent", "0"])
