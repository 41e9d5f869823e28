"""The reward service on loopback: round trip, compact payloads, timeouts, server down, bad payloads."""
from __future__ import annotations

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
from margrpo.rewards.server import RewardServer, main, rewards_from_args
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
    srv = RewardServer({"mean_pixel": MeanPixel(), "slow": Slow(1.0), "broken": broken,
                        "jpeg": build_reward("jpeg_incompressibility", device="cpu")}, port=0).start()
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
        decode_request(save({"images": torch.zeros(1, 3, 2, 2, dtype=torch.uint8)},
                            metadata={"prompts": "[1]", "metadata": "null"}))


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
    args = argparse.Namespace(config=str(config), reward=["jpeg_incompressibility"],
                              option=["jpeg_incompressibility.quality=70", "jpeg_incompressibility.device=cpu"])
    built = rewards_from_args(args)
    assert sorted(built) == ["jpeg_incompressibility", "small"]
    assert built["small"].quality == 40 and built["jpeg_incompressibility"].quality == 70
    bad = argparse.Namespace(config=None, reward=["jpeg_compressibility"], option=["other.quality=1"])
    with pytest.raises(ValueError, match="--option 'other.quality=1': expected NAME.KEY=VALUE"):
        rewards_from_args(bad)
    with pytest.raises(SystemExit) as exit_info:
        main(["--port", "0"])  # argparse-style usage error: exit status 2
    assert exit_info.value.code == 2
