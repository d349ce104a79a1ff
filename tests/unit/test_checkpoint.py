"""Tests for hvd_async.checkpoint: exact round trip, atomic writes under SIGKILL, every refusal, pruning."""
import glob
import os
import random
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from hvd_async import checkpoint
from hvd_async.checkpoint import CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
META = {"algorithm": "asgd", "world_size": 5, "workers": 4, "servers": 1, "model": "mlp",
        "params": {"weight": torch.Size([3, 5]), "bias": torch.Size([3])}}


def assert_same(a, b, where="state"):
    """Equal values of equal types, tensors bit for bit (torch.equal, same dtype)."""
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)) and not isinstance(a, torch.Size):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def realistic_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 5)).pow(2).sum().backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "algorithm": {"steps": 7, "staleness_hist": [3, 1, 0, 2], "lr": 0.05, "name": "asgd",
                          "server": {"weights": [torch.randn(3, 5), torch.randn(3)],
                                     "version": torch.tensor(12), "half": torch.randn(2).half()}},
            "sampler": {"epoch": 2, "position": 128, "order": torch.randperm(10)},
            "rng": checkpoint.rng_state()}


def draws():
    return random.random(), np.random.rand(3).tolist(), torch.rand(3)


# ---------------------------------------------------------------- round trip

def test_round_trip_is_exact_and_rng_repeats(tmp_path):
    path = str(tmp_path / "ck.pt")
    state = realistic_state()
    checkpoint.save(path, state, meta=META)
    after_save = draws()
    draws()  # move every generator on
    loaded = checkpoint.load(path, expect=META)
    assert_same(state, loaded)
    assert loaded["model"]._metadata == state["model"]._metadata  # state_dict versions survive
    checkpoint.set_rng_state(loaded["rng"])
    again = draws()
    assert again[:2] == after_save[:2] and torch.equal(again[2], after_save[2])


def test_save_refuses_what_weights_only_cannot_load_and_writes_nothing(tmp_path):
    path = str(tmp_path / "ck.pt")
    with pytest.raises(TypeError, match=r"state\['algorithm'\]\['hist'\] is a numpy.ndarray.*tolist"):
        checkpoint.save(path, {"algorithm": {"hist": np.zeros(3)}})
    with pytest.raises(TypeError, match=r"meta\['workers'\] is a numpy.int64"):
        checkpoint.save(path, {}, meta={"workers": np.int64(4)})
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- atomic write under SIGKILL

CHILD = """
import sys, torch
sys.path.insert(0, {root!r})
from hvd_async import checkpoint
path, marker, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
while True:
    checkpoint.save(path, {{"marker": marker, "data": torch.full((n,), marker, dtype=torch.int32),
                            "checksum": marker * n}})
    print(marker, flush=True)
    marker += 1
"""


def check_whole(state, n):
    marker = state["marker"]
    assert state["data"].numel() == n and state["checksum"] == marker * n
    assert int(state["data"].sum()) == marker * n and bool((state["data"] == marker).all())
    return marker


def test_sigkill_while_saving_leaves_a_whole_checkpoint(tmp_path):
    n = 13_000_000  # 52 MB of int32
    path = str(tmp_path / "ck.pt")
    checkpoint.save(path, {"marker": 0, "data": torch.zeros(n, dtype=torch.int32), "checksum": 0})
    good, rng = 0, random.Random(8)  # hangs are caught by the per-child timeouts below
    for trial in range(1, 9):
        first = trial * 1000
        proc = subprocess.Popen([sys.executable, "-c", CHILD.format(root=ROOT), path, str(first), str(n)],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready and proc.stdout.readline() == "ready\n", "saving child did not start"
            time.sleep(rng.uniform(0.0, 0.3))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            done = [int(line) for line in proc.stdout.read().split()]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            proc.stdout.close()
        # The file holds the last save reported done, or the one in flight if its rename had happened.
        last = done[-1] if done else good
        in_flight = last + 1 if done else first
        good = check_whole(checkpoint.load(path), n)
        assert good in (last, in_flight), (trial, done, good)
    checkpoint.save(path, {"marker": -1})  # the next save removes what killed saves left
    assert glob.glob(path + ".tmp-*") == []
    assert checkpoint.load(path) == {"marker": -1}


# ---------------------------------------------------------------- refusals

def refusal(path, **kwargs):
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and path in message
    return message


def test_missing_file(tmp_path):
    assert "does not exist" in refusal(str(tmp_path / "nope.pt"))


def test_truncated_file(tmp_path):
    path = str(tmp_path / "ck.pt")
    checkpoint.save(path, realistic_state())
    os.truncate(path, os.path.getsize(path) // 2)
    assert "truncated, corrupt or not a torch file" in refusal(path)


def test_random_bytes_and_empty_file(tmp_path):
    path = str(tmp_path / "ck.pt")
    for content in (random.Random(0).randbytes(4096), b"", b"hello world\n"):
        with open(path, "wb") as f:
            f.write(content)
        assert "truncated, corrupt or not a torch file" in refusal(path)


def test_torch_file_without_header(tmp_path):
    path = str(tmp_path / "ck.pt")
    torch.save({"model": torch.nn.Linear(2, 2).state_dict()}, path)
    assert "not a hvd_async checkpoint" in refusal(path)


def test_unknown_format_version(tmp_path):
    path = str(tmp_path / "ck.pt")
    torch.save({"hvd_async_checkpoint": 99, "kind": "train", "created": 0.0, "meta": {}, "state": {}}, path)
    assert "format version 99" in refusal(path)


def test_meta_mismatch_names_both_values_of_each_differing_key(tmp_path):
    path = str(tmp_path / "ck.pt")
    checkpoint.save(path, {"steps": 1}, meta=META)
    message = refusal(path, expect=dict(META, algorithm="ssgd", workers=2))
    assert "algorithm='asgd'" in message and "workers=4" in message
    assert "algorithm='ssgd'" in message and "workers=2" in message
    assert "servers" not in message and "start without --resume" in message
    message = refusal(path, expect={"params": {"weight": [3, 6], "bias": [3]}, "optimizer": "sgd"})
    assert "params['weight']=[3, 5]" in message and "params['weight']=[3, 6]" in message
    assert "no optimizer" in message and "optimizer='sgd'" in message
    # Shapes as lists or tuples match torch.Size; keys not asked about are not compared.
    assert checkpoint.load(path, expect={"params": {"weight": [3, 5], "bias": (3,)}}) == {"steps": 1}


def test_kind_mismatch(tmp_path):
    path = str(tmp_path / "ck.pt")
    checkpoint.save(path, {}, kind="emergency")
    assert "'emergency' checkpoint, expected 'train'" in refusal(path, kind="train")


# ---------------------------------------------------------------- latest, save_in, keep

def names(directory):
    return sorted(os.listdir(directory))


def test_latest_and_pruning(tmp_path):
    directory = str(tmp_path / "ck")
    assert checkpoint.latest(directory) is None
    os.makedirs(directory)
    assert checkpoint.latest(directory) is None
    for stray in ("notes.txt", "ckpt-99.pt.tmp-999999999", "ckpt-x.pt"):
        open(os.path.join(directory, stray), "w").close()
    for step in (1, 2, 3, 10):
        path = checkpoint.save_in(directory, step, {"step": step}, keep=2, meta={"model": "mlp"})
        assert path == os.path.join(directory, f"ckpt-{step}.pt")
    assert [n for n in names(directory) if n.endswith(".pt")] == ["ckpt-10.pt", "ckpt-3.pt", "ckpt-x.pt"]
    assert checkpoint.latest(directory) == os.path.join(directory, "ckpt-10.pt")  # by number, not by name
    assert checkpoint.load(checkpoint.latest(directory), expect={"model": "mlp"}) == {"step": 10}
    checkpoint.save_in(directory, 5, {"step": 5}, keep=2)  # the one just written is always kept
    assert {"ckpt-5.pt", "ckpt-10.pt"} <= set(names(directory)) and "ckpt-3.pt" not in names(directory)
    checkpoint.save_in(directory, 11, {"step": 11}, keep=1)
    assert [n for n in names(directory) if n.startswith("ckpt-") and n.endswith("0.pt")] == []
    assert "ckpt-11.pt" in names(directory) and "notes.txt" in names(directory)


def test_failed_save_in_deletes_nothing(tmp_path):
    directory = str(tmp_path)
    checkpoint.save_in(directory, 1, {"step": 1}, keep=1)
    with pytest.raises(TypeError):
        checkpoint.save_in(directory, 2, {"step": np.zeros(2)}, keep=1)
    assert names(directory) == ["ckpt-1.pt"] and checkpoint.latest(directory).endswith("ckpt-1.pt")


@pytest.mark.parametrize("kwargs", [{"step": -1}, {"step": 1.5}, {"keep": 0}, {"keep": True}])
def test_save_in_checks_step_and_keep(tmp_path, kwargs):
    args = dict({"step": 1, "keep": 2}, **kwargs)
    with pytest.raises(ValueError, match="step must be|keep must be"):
        checkpoint.save_in(str(tmp_path), args.pop("step"), {}, **args)


def test_directory_instead_of_file(tmp_path):
    assert "cannot be opened (IsADirectoryError" in refusal(str(tmp_path))


def test_the_launchers_resume_check_reads_the_newest_checkpoint_and_refuses_like_the_job(tmp_path):
    from hvd_async.job.jobstate import load_newest

    def check_resumable(directory, expect):  # as the launcher calls it
        return load_newest(directory, expect, mmap=True)[0]

    with pytest.raises(CheckpointError, match=r"--resume: no checkpoint \(ckpt-<step>.pt\) in "):
        check_resumable(str(tmp_path), META)
    checkpoint.save_in(str(tmp_path), 3, {"weights": torch.arange(4.0)}, meta=META)
    newest = checkpoint.save_in(str(tmp_path), 7, {"weights": torch.arange(4.0)}, meta=META)
    assert check_resumable(str(tmp_path), {k: META[k] for k in ("algorithm", "workers", "model")}) == newest
    with pytest.raises(CheckpointError, match=r"written with workers=4; this job runs with workers=3"):
        check_resumable(str(tmp_path), dict(META, workers=3))
    # bytes that are no zip file get the loader's own reason, not the memory map's
    with open(os.path.join(tmp_path, "ckpt-9.pt"), "wb") as f:
        f.write(b"not a checkpoint\n" * 32)
    with pytest.raises(CheckpointError, match=r"is truncated, corrupt or not a torch file \(") as info:
        check_resumable(str(tmp_path), META)
    assert "mmap" not in str(info.value), info.value
