"""easgd's elastic move and gossip's mixing against hand-computed numbers; their options' errors; the
peer schedules (reproducible, never self, ring and exponential graphs). One process, no MPI."""
import numpy as np
import pytest
import torch

from hvd_async import registry
from hvd_async.algorithms.base import parse_options
from hvd_async.algorithms.easgd import EASGDOptions
from hvd_async.algorithms.gossip import GossipOptions
from hvd_async.algorithms.peers import PeerSchedule, exponential_offsets
from hvd_async.rules.elastic import default_alpha, elastic_move, resolve_alpha, sync_round
from hvd_async.rules.mixing import (pull_average_, push_sum_estimate_, push_sum_fold_, push_sum_receive_,
                                    push_sum_split_)


# --- easgd ---------------------------------------------------------------------------------------

def test_elastic_move_hand_computed():
    w, c = torch.tensor([1.0, 2.0, -3.0]), torch.tensor([0.0, 4.0, -1.0])
    d = elastic_move(w, c, 0.5)
    assert d.tolist() == [0.5, -1.0, -1.0]
    assert w.tolist() == [1.0, 2.0, -3.0] and c.tolist() == [0.0, 4.0, -1.0]  # inputs untouched
    out = torch.empty(3)
    assert elastic_move(w, c, 0.25, out=out) is out and out.tolist() == [0.25, -0.5, -0.5]


def test_synchronous_rounds_hand_computed():
    # workers 2 and 4, centre 0, alpha 1/4; written out round by round
    workers, centre = [torch.tensor([2.0]), torch.tensor([4.0])], torch.tensor([0.0])
    expected = [([1.5, 3.0], 1.5), ([1.5, 2.625], 1.875), ([1.59375, 2.4375], 1.96875)]
    for want_workers, want_centre in expected:
        workers, centre = sync_round(workers, centre, 0.25)
        assert [w.item() for w in workers] == want_workers and centre.item() == want_centre
        assert sum(w.item() for w in workers) + centre.item() == 6.0  # a move keeps w + c


def test_asynchronous_moves_against_a_stale_centre_lose_nothing():
    # both workers read centre 0; worker 1's move lands first, worker 2's against the stale read
    alpha, centre = 0.5, torch.tensor([0.0])
    w1, w2 = torch.tensor([2.0]), torch.tensor([6.0])
    read1 = read2 = centre.clone()
    d1, d2 = elastic_move(w1, read1, alpha), elastic_move(w2, read2, alpha)
    w1, w2 = w1 - d1, w2 - d2
    centre = centre + d1 + d2
    assert (w1.item(), w2.item(), centre.item()) == (1.0, 3.0, 4.0)
    assert w1.item() + w2.item() + centre.item() == 8.0


def test_alpha_resolution():
    assert default_alpha(4) == pytest.approx(0.225)
    assert resolve_alpha(None, None, lr=0.1, workers=3) == pytest.approx(0.3)
    assert resolve_alpha(0.2, None, lr=0.1, workers=3) == 0.2
    assert resolve_alpha(None, 2.0, lr=0.1, workers=3) == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"got 2.0 \(from lr \* rho = 0.5 \* 4.0\)"):
        resolve_alpha(None, 4.0, lr=0.5, workers=3)
    with pytest.raises(ValueError, match="give alpha or rho, not both"):
        resolve_alpha(0.1, 1.0, lr=0.1, workers=3)


@pytest.mark.parametrize("options,fragment", [
    ({"tau": 0}, "tau must be an integer >= 1 (local steps between elastic moves), got 0"),
    ({"tau": 2.5}, "tau must be an integer >= 1 (local steps between elastic moves), got 2.5"),
    ({"alpha": 1.5}, "alpha must be a number in (0, 1)"),
    ({"alpha": 0}, "got 0"),
    ({"alpha": float("nan")}, "got nan"),
    ({"rho": -1}, "rho must be a finite number > 0 (alpha = lr * rho), got -1"),
    ({"alpha": 0.1, "rho": 1.0}, "give alpha or rho, not both (alpha=0.1, rho=1.0)"),
    ({"synchronous": "yes"}, "synchronous must be True or False, got 'yes'"),
])
def test_easgd_options_errors_name_the_value(options, fragment):
    with pytest.raises(ValueError) as info:
        EASGDOptions(**options)
    assert fragment in str(info.value)


def test_unknown_options_list_the_accepted():
    with pytest.raises(TypeError, match="unknown option.*'beta'.*accepted: tau, alpha, rho, synchronous"):
        parse_options(EASGDOptions, "easgd", {"beta": 0.9})
    with pytest.raises(TypeError, match="accepted: every, variant, topology, seed, progress_interval"):
        parse_options(GossipOptions, "gossip", {"peers": 2})


# --- gossip mixing ---------------------------------------------------------------------------------

def test_pull_average_hand_computed():
    w = torch.tensor([1.0, 4.0, -2.0])
    assert pull_average_(w, torch.tensor([3.0, 0.0, 2.0])) is w
    assert w.tolist() == [2.0, 2.0, 0.0]


def test_push_sum_split_fold_estimate_hand_computed():
    x, send = torch.tensor([4.0, -2.0]), torch.empty(2)
    s = push_sum_split_(x, 1.0, send)
    assert (s, x.tolist(), send.tolist()) == (0.5, [2.0, -1.0], [2.0, -1.0])
    s = push_sum_receive_(x, s, torch.tensor([1.0, 1.0]), 0.25)  # a peer's half arrives
    assert (s, x.tolist()) == (0.75, [3.0, 0.0])
    z = push_sum_estimate_(x, s, torch.empty(2))
    assert z.tolist() == [4.0, 0.0]
    push_sum_fold_(x, s, torch.tensor([1.0, -2.0]))  # the model moved by (1, -2)
    assert push_sum_estimate_(x, s, torch.empty(2)).tolist() == [5.0, -2.0]
    with pytest.raises(ValueError, match="push-sum weight must be > 0, got 0"):
        push_sum_estimate_(x, 0.0, torch.empty(2))


def test_push_sum_keeps_the_mass_and_reaches_the_mean():
    rng, n = np.random.default_rng(0), 5
    xs = [torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    ss = [1.0] * n
    total, send = sum(xs).clone(), torch.empty(6, dtype=torch.float64)
    for _ in range(400):
        i = int(rng.integers(n))
        j = (i + int(rng.integers(1, n))) % n
        ss[i] = push_sum_split_(xs[i], ss[i], send)
        ss[j] = push_sum_receive_(xs[j], ss[j], send, ss[i])
    torch.testing.assert_close(sum(xs), total, rtol=1e-12, atol=1e-12)
    assert sum(ss) == pytest.approx(n, abs=1e-12)
    for x, s in zip(xs, ss):
        torch.testing.assert_close(x / s, total / n, rtol=0, atol=1e-6)


@pytest.mark.parametrize("options,fragment", [
    ({"every": 0}, "every must be an integer >= 1 (mix with a peer every k steps), got 0"),
    ({"variant": "pushsum"}, "variant must be one of pull, push"),
    ({"topology": "star"}, "topology must be one of random, ring, exponential, got 'star'"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"progress_interval": 0}, "progress_interval must be in (0, 1] seconds, got 0"),
])
def test_gossip_options_errors_name_the_value(options, fragment):
    with pytest.raises(ValueError) as info:
        GossipOptions(**options)
    assert fragment in str(info.value)


# --- peer schedules ---------------------------------------------------------------------------------

def _draw(topology, rank, size, seed=0, count=40):
    schedule = PeerSchedule(topology, rank=rank, size=size, seed=seed)
    return [schedule.next() for _ in range(count)]


@pytest.mark.parametrize("size", [2, 3, 4, 5, 7, 8])
def test_peers_never_self_and_reproducible(size):
    for topology in ("random", "ring", "exponential"):
        for rank in range(size):
            peers = _draw(topology, rank, size, seed=11)
            assert all(0 <= p < size and p != rank for p in peers), (topology, rank, peers)
            assert peers == _draw(topology, rank, size, seed=11)
    if size > 2:
        assert _draw("random", 0, size, seed=1) != _draw("random", 0, size, seed=2)
        assert _draw("random", 0, size, seed=1) != _draw("random", 1, size, seed=1)
        assert set(_draw("random", 0, size, count=200)) == set(range(1, size))  # every other worker


def test_ring_and_exponential_graphs():
    assert _draw("ring", 3, 4, count=3) == [0, 0, 0]
    assert exponential_offsets(1) == [] and exponential_offsets(2) == [1]
    assert exponential_offsets(4) == [1, 2] and exponential_offsets(5) == [1, 2, 4]
    assert exponential_offsets(8) == [1, 2, 4] and exponential_offsets(9) == [1, 2, 4, 8]
    assert _draw("exponential", 0, 5, count=5) == [1, 2, 4, 1, 2]
    assert _draw("exponential", 6, 8, count=4) == [7, 0, 2, 7]
    for size in (2, 3, 5, 8):  # within one cycle of offsets each worker reaches log2(size) others
        reached = {p for r in range(size) for p in _draw("exponential", r, size, count=len(exponential_offsets(size)))}
        assert reached == set(range(size))


def test_one_worker_has_no_peer_and_bad_arguments_fail():
    assert _draw("random", 0, 1, count=3) == [None, None, None]
    with pytest.raises(ValueError, match="topology must be one of random, ring, exponential, got 'mesh'"):
        PeerSchedule("mesh", rank=0, size=2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        PeerSchedule("ring", rank=2, size=2)


def test_peer_transport_checks_arguments_before_mpi():
    from hvd_async.transport.peer import PeerWindowTransport

    with pytest.raises(ValueError, match="numel must be a positive integer, got 0"):
        PeerWindowTransport(0, comms=None, name="t")
    with pytest.raises(ValueError, match=r"progress_interval must be in \(0, 1\] seconds, got -1"):
        PeerWindowTransport(3, comms=None, name="t", progress_interval=-1)


def test_registry_rows():
    assert registry.algorithm("gossip").name == "gossip" and not registry.get("gossip").uses_servers
    assert registry.algorithm("easgd").name == "easgd" and registry.get("easgd").uses_servers
