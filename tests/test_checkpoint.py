"""Checkpoints: atomic, verified, pruned; corrupt or truncated ones are named, never loaded."""

import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from margrpo.train import checkpoint as ckpt


def _state(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"optimizer": opt.state_dict(), "rng": ckpt.rng_state(), "step": 7}


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    model = torch.nn.Linear(3, 2)
    state = _state(model)
    ckpt.save(tmp_path, 7, dict(model.named_parameters()), state)
    expected_draw = (torch.rand(3), random.random())
    weights, loaded = ckpt.load(ckpt.latest(tmp_path))
    for name, param in model.named_parameters():
        assert torch.equal(weights[name], param.detach())
    assert loaded["step"] == 7
    assert loaded["optimizer"]["state"][0]["exp_avg"].equal(state["optimizer"]["state"][0]["exp_avg"])
    ckpt.set_rng_state(loaded["rng"])
    torch.manual_seed(0)  # perturb, then restore again: the draws must repeat
    ckpt.set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(3), expected_draw[0]) and random.random() == expected_draw[1]


def test_keep_last_n(tmp_path):
    model = torch.nn.Linear(3, 2)
    for step in range(5):
        ckpt.save(tmp_path, step, dict(model.named_parameters()), {"step": step}, keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest"])
def test_corrupt_checkpoint_is_named(tmp_path, damage):
    model = torch.nn.Linear(3, 2)
    path = ckpt.save(tmp_path, 1, dict(model.named_parameters()), {"step": 1})
    target = path / "weights.safetensors"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:-10])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF
        target.write_bytes(bytes(data))
    else:
        (path / "manifest.json").unlink()
    with pytest.raises(ckpt.CorruptCheckpointError, match=str(path.name)):
        ckpt.load(path)


def test_kill_during_write_leaves_previous_checkpoint_loadable(tmp_path):
    model = torch.nn.Linear(3, 2)
    ckpt.save(tmp_path, 1, dict(model.named_parameters()), {"step": 1})
    # a child process starts writing a big checkpoint and is killed -9 mid-write
    script = textwrap.dedent(f"""
        import torch, sys
        from margrpo.train import checkpoint as ckpt
        big = {{"w": torch.randn(4096, 4096)}}
        print("start", flush=True)
        ckpt.save({str(tmp_path)!r}, 2, big, {{"step": 2, "blob": torch.randn(8192, 4096)}})
        print("done", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "start"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    latest = ckpt.latest(tmp_path)
    weights, state = ckpt.load(latest)
    assert state["step"] in (1, 2)  # 2 only if the write finished before the kill landed
    assert not any(p.name.startswith("step-") and not (p / "manifest.json").exists() for p in tmp_path.iterdir())


def _save(root, step, keep_last=3):
    model = torch.nn.Linear(3, 2)
    return ckpt.save(root, step, dict(model.named_parameters()), {"step": step}, keep_last=keep_last)


def test_a_kill_between_the_renames_of_a_re_save_is_recovered(tmp_path, monkeypatch):
    """Re-saving a step moves the old directory aside, then the new one in; killed in between, the
    complete temporary copy is what recover() moves into place."""
    _save(tmp_path, 2)
    final = _save(tmp_path, 4)
    real_replace = ckpt.os.replace

    def killed_before_the_new_copy_lands(src, dst):
        if ".tmp-" in str(src):
            raise KeyboardInterrupt  # stands for the kill
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", killed_before_the_new_copy_lands)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 4)
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    assert not final.exists()  # step 4 is out of the listing, its complete copy beside it
    assert ckpt.latest(tmp_path).name == "step-00000002"
    done = ckpt.recover(tmp_path)
    assert any("restored step-00000004" in line for line in done)
    assert ckpt.latest(tmp_path) == final and ckpt.load(final)[1]["step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000004"]


def test_a_step_without_manifest_falls_back_to_its_complete_copy_or_an_older_step(tmp_path):
    """What the old re-save left when killed mid-delete: step-4 without its manifest, a complete
    temporary copy of step 4 (and a valid step 2)."""
    _save(tmp_path, 2)
    final = _save(tmp_path, 4)
    shutil.copytree(final, tmp_path / ".tmp-step-00000004-99999")
    (final / "manifest.json").unlink()
    assert ckpt.latest(tmp_path).name == "step-00000002"  # listed no more: never raises, never loads it
    ckpt.recover(tmp_path)
    assert ckpt.latest(tmp_path) == final and ckpt.load(final)[1]["step"] == 4
    (final / "manifest.json").unlink()  # now with no copy: recover deletes it, step 2 is the newest
    ckpt.recover(tmp_path)
    assert not final.exists() and ckpt.latest(tmp_path).name == "step-00000002"


def test_leftovers_are_removed_and_stray_names_ignored(tmp_path):
    _save(tmp_path, 1)
    for name in (".tmp-step-00000002-123", ".trash-step-00000001-456"):  # incomplete / discarded
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.safetensors").write_bytes(b"x" * 100)
    for name in ("step-00000004.bak", "step-latest", "step-"):  # a user's names: not checkpoints
        (tmp_path / name).mkdir()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]
    assert ckpt.latest(tmp_path).name == "step-00000001"
    ckpt.recover(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-", "step-00000001", "step-00000004.bak", "step-latest"]
    _save(tmp_path, 2, keep_last=1)  # pruning passes over them too
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000002"]


def test_a_corrupt_newest_checkpoint_is_named_and_passed_over(tmp_path, capsys):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    (newest / "state.pt").write_bytes(b"torn")
    assert ckpt.latest(tmp_path).name == "step-00000001"
    assert "step-00000002" in capsys.readouterr().err


@pytest.mark.parametrize("manifest", ["{}", "[]", '{"step": 1, "files": {}}', '{"step": 1, "files": {"state.pt": 3}}'])
def test_a_malformed_manifest_is_a_corrupt_checkpoint(tmp_path, manifest):
    path = _save(tmp_path, 1)
    (path / "manifest.json").write_text(manifest)
    with pytest.raises(ckpt.CorruptCheckpointError, match="not a checkpoint manifest"):
        ckpt.load(path)


def test_random_kills_while_re_saving_never_leave_no_valid_checkpoint(tmp_path):
    """A child re-saves step 2 (every run whose steps is a multiple of save_every saves its last
    step twice) and writes step 3, pruning to one; kill -9 at random moments, recover, and the
    newest valid checkpoint is always there and loads."""
    _save(tmp_path, 1)
    script = textwrap.dedent(f"""
        import torch
        from margrpo.train import checkpoint as ckpt
        big = {{"w": torch.randn(1024, 1024)}}
        print("start", flush=True)
        for step in (2, 2, 2, 3, 3):
            ckpt.save({str(tmp_path)!r}, step, big, {{"step": step, "blob": torch.randn(1024, 2048)}}, keep_last=1)
    """)
    rng = random.Random(0)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "start"
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ckpt.recover(tmp_path)
        latest = ckpt.latest(tmp_path)
        assert latest is not None
        assert ckpt.load(latest)[1]["step"] in (1, 2, 3)
        assert all(p.name.startswith("step-") for p in tmp_path.iterdir())  # no leftovers after recover
