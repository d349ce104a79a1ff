"""What one server shard holds, from the code's own accounting (hvd_async/sim/memory.py), and the
guide's table generated from it."""
import os
import subprocess
import sys

import pytest

from hvd_async.sim.memory import shard_copies

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dc_asgd_with_a_slot_per_worker_holds_3w_plus_5_copies():
    """weights, inbox W, outbox W (the backups), momentum W, mean square, 2 scratch, look-ahead sum."""
    for workers in (2, 4, 8):
        copies = shard_copies("dc-asgd", workers, {"inbox_slots": 0})
        assert (copies["windows"], copies["program"]) == (1 + 2 * workers, workers + 4)


def test_a_pool_of_slots_stops_the_inbox_growing():
    """Past the pool's size an extra worker costs dc-asgd its backup and its momentum, od-sgd nothing."""
    at = lambda algo, w, **o: shard_copies(algo, w, o)["total"]  # noqa: E731
    assert at("dc-asgd", 12, inbox_slots=2) - at("dc-asgd", 8, inbox_slots=2) == 4 * 2
    assert at("dc-asgd", 8, inbox_slots=2) == at("dc-asgd", 8, inbox_slots=0) - 6
    od = {"exchange": "window", "inbox_slots": 2}
    assert at("od-sgd", 16, **od) == at("od-sgd", 4, **od) == 5
    assert at("softsync", 16, inbox_slots=4) - at("softsync", 8, inbox_slots=4) == 8 * 2


def test_shared_momentum_leaves_only_the_backups_growing():
    """Past a pool of 2 slots: dc-asgd and lc-asgd keep one backup per worker and no momentum copy;
    softsync, answering through the weights window, keeps nothing per worker."""
    at = lambda algo, w, **o: shard_copies(algo, w, dict(inbox_slots=2, **o))["total"]  # noqa: E731
    for algo in ("dc-asgd", "lc-asgd"):
        assert at(algo, 8, server_momentum="shared") - at(algo, 4, server_momentum="shared") == pytest.approx(4.0)
        assert at(algo, 8) - at(algo, 4) == pytest.approx(8.0)  # (per-worker: the momentum copies too)
    assert at("softsync", 8, server_momentum="shared") == pytest.approx(at("softsync", 4, server_momentum="shared"))


@pytest.mark.parametrize("workers", [2, 6])
def test_fp16_slots_save_half_a_copy_each_and_widen_into_one_buffer(workers):
    """Half-size slots, one shared fp32 widening buffer (not one per worker) and the rule's one kept
    buffer for the fp16 backups."""
    half = shard_copies("dc-asgd", workers, {"inbox_slots": 0, "compression": "fp16"})
    full = shard_copies("dc-asgd", workers, {"inbox_slots": 0})
    assert half["windows"] == 1 + workers and half["program"] == full["program"] + 2


def test_the_guides_memory_table_is_the_code():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_memory_table.py"), "--check"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
