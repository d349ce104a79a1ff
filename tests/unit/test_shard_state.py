"""A shard's state for worker 0 (the gathered form of a checkpoint) refuses, with one line naming the way
out, a state larger than one MPI message carries, instead of failing inside MPI; the server writes it to
a file of its own whatever its size."""
import pytest
import torch

from hvd_async import checkpoint, registry
from hvd_async.algorithms.base import parse_options
from hvd_async.sim.windows import SimShardHost
from hvd_async.transport.window import host as host_module


def _host(numel=1000, workers=3):
    cls = registry.algorithm("dc-asgd")
    options = parse_options(cls.Options, "dc-asgd", {})
    cls.resolve_options(options, workers)
    return SimShardHost(cls.window_spec(options, numel, 1, workers), 0, cls.server_program)


def test_a_state_over_one_message_is_refused_naming_shard_dir(monkeypatch):
    host = _host()
    status, state = host._state_message()
    assert status == "ok" and torch.equal(state["weights"], host.weights)
    monkeypatch.setattr(host_module, "MESSAGE_LIMIT", 4 * 1000)  # the weights alone fill it
    status, why = host._state_message()
    assert status == "error" and "take it with algorithm_state_dict(shard_dir=...)" in why, why


@pytest.mark.parametrize("copy", [True, False])
def test_the_state_is_the_shards_own_tensors_only_when_asked(copy):
    host = _host()
    state = host.state_dict(copy=copy)
    assert (state["weights"].data_ptr() == host.weights.data_ptr()) is not copy


def test_a_shard_written_to_its_file_loads_back_exactly(tmp_path):
    host = _host()
    host.weights.normal_()
    status, named = host._save(str(tmp_path / "shard-0.pt"))
    assert status == "ok" and named["shard_file"] == "shard-0.pt" and named["bytes"] > 4 * 1000
    saved = checkpoint.load(str(tmp_path / "shard-0.pt"), kind=host_module.SHARD_KIND)
    assert torch.equal(saved["weights"], host.weights)
