"""The parameter servers' programs driven by hand, without MPI: a fake shard host receives the same
sequence of pushes under two algorithms, and the weights they leave are compared.

softsync keeps a momentum buffer per worker (as dc-asgd does), so at its two ends it is exactly the
algorithms it generalises: n = workers with the rate unscaled is dc-asgd with lam = 0 (asgd's
update, per-worker momentum), and n = 1 is synchronous SGD with one momentum buffer on the mean
gradient."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hvd_async.algorithms.dcasgd import DCASGDOptions, DCPayload, DCProgram
from hvd_async.algorithms.payload import SGDPayload
from hvd_async.algorithms.softsync import SoftSyncOptions, SoftSyncProgram
from hvd_async.rules import SGDRule
from hvd_async.transport import window as W

N, WORKERS = 7, 4


class FakeHost:
    """What a server program reads and calls on its shard host, in memory."""

    def __init__(self, weights):
        self.spec = SimpleNamespace(workers=WORKERS, outbox=True)
        self.weights = weights.clone()
        self.inbox = [torch.zeros(N) for _ in range(WORKERS)]
        self.outbox = [torch.zeros(N) for _ in range(WORKERS)]
        self.version, self.shard, self.skipped_nonfinite = 0, 0, 0
        self.answers = []

    def bump(self, staleness, pushes=1):
        self.version += 1

    def answer(self, worker, staleness, status):
        self.answers.append((worker, staleness, status))

    def add_sums(self, *values):
        pass


def dc_options(**given):
    """dc-asgd's options with the look-ahead and the push clip off unless given."""
    return DCASGDOptions(**dict(dict(lookahead=False, push_clip=0.0), **given))


def softsync_options(**given):
    """softsync's options with one shared buffer, the full rate and no look-ahead unless given."""
    return SoftSyncOptions(**dict(dict(server_momentum="shared", push_rate="full", lookahead=False), **given))


def header(worker=0, lr=0.1, momentum=0.9, weight_decay=0.01):
    h = np.zeros(W.H_LEN, dtype=np.float64)  # as a worker encodes it, as the host decodes it
    W.encode_request(h, W.Kind.PUSH, SGDPayload(lr=lr, momentum=momentum, weight_decay=weight_decay).encode())
    return W.Request.decode(h, 0, worker)  # (the worker's own inbox slot)


def push(program, worker, grad):
    program.host.inbox[worker].copy_(grad)
    program.on_request(worker, header(worker))


def gradients(rounds, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(N, generator=gen) for _ in range(WORKERS)] for _ in range(rounds)]


@pytest.mark.parametrize("momentum", ["per-worker", "shared"])
def test_softsync_at_n_workers_unscaled_is_asgd_under_momentum(momentum):
    """An interleaved order of pushes (as asynchrony makes it): per-worker buffers give dc-asgd's
    (lam 0) weights bit for bit; one shared buffer does not (it mixes every worker's momentum)."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(1))
    soft = SoftSyncProgram(FakeHost(w0), softsync_options(n=WORKERS, staleness_lr=False, server_momentum=momentum))
    dc = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, ms_momentum=0.95))
    order = [0, 1, 0, 2, 3, 1, 1, 0, 3, 2, 2, 0, 1, 3]
    rng = gradients(len(order))
    for i, worker in enumerate(order):
        push(soft, worker, rng[i][worker])
        push(dc, worker, rng[i][worker])
    same = torch.equal(soft.host.weights, dc.host.weights)
    assert same is (momentum == "per-worker"), (soft.host.weights - dc.host.weights).abs().max()


def test_softsync_at_n_one_is_synchronous_sgd_with_one_buffer():
    """n = 1: each aggregate holds one gradient from every worker; per-worker buffers averaged are
    ssgd's buffer of the averaged gradient (to rounding)."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(2))
    soft = SoftSyncProgram(FakeHost(w0), softsync_options(n=1, staleness_lr=True, server_momentum="per-worker"))
    reference, state = w0.clone(), {}
    for grads in gradients(6, seed=3):
        for worker in (2, 0, 3, 1):
            push(soft, worker, grads[worker])
        SGDRule().apply_(reference, torch.stack(grads).mean(0), state, lr=0.1, momentum=0.9, weight_decay=0.01)
    torch.testing.assert_close(soft.host.weights, reference, rtol=1e-5, atol=1e-6)
    assert soft.host.version == 6


def test_softsync_momentum_survives_a_state_dict():
    w0 = torch.zeros(N)
    first = SoftSyncProgram(FakeHost(w0), softsync_options(n=WORKERS, staleness_lr=True, server_momentum="per-worker"))
    for i, worker in enumerate([0, 1, 2, 0]):
        push(first, worker, gradients(4)[i][worker])
    second = SoftSyncProgram(FakeHost(first.host.weights),
                             softsync_options(n=WORKERS, staleness_lr=True, server_momentum="per-worker"))
    second.load_state_dict(first.state_dict())
    second.host.version, second.host.outbox = first.host.version, [o.clone() for o in first.host.outbox]
    for program in (first, second):
        push(program, 1, torch.ones(N))
    assert torch.equal(first.host.weights, second.host.weights)


def _by_hand_lookahead(program, lr, momentum):
    """``w - lr * momentum * sum_k buf_k`` from the program's per-worker buffers, summed here."""
    total = torch.zeros(N)
    for state in program.momentum:
        if "momentum_buffer" in state:
            total += state["momentum_buffer"]
    return program.host.weights - lr * momentum * total


def test_lookahead_answers_where_the_workers_momentum_carries_the_weights():
    """dc-asgd (lam 0, so the backups do not enter the update): the look-ahead leaves the servers' weights
    as they are and answers each push with them moved by every worker's momentum term."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(4))
    ahead = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, ms_momentum=0.95, lookahead=True))
    plain = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, ms_momentum=0.95))
    order = [0, 1, 0, 2, 3, 1, 1, 0, 3, 2]
    rng = gradients(len(order), seed=5)
    for i, worker in enumerate(order):
        push(ahead, worker, rng[i][worker])
        push(plain, worker, rng[i][worker])
        assert torch.equal(ahead.host.weights, plain.host.weights)
        assert torch.equal(plain.host.outbox[worker], plain.host.weights)
        torch.testing.assert_close(ahead.host.outbox[worker], _by_hand_lookahead(ahead, 0.1, 0.9),
                                   rtol=1e-6, atol=1e-6)
        assert not torch.allclose(ahead.host.outbox[worker], ahead.host.weights)


def test_softsync_lookahead_is_dc_asgds_at_n_workers():
    """softsync with n = workers and the rate unscaled applies each push alone: its answers are
    dc-asgd's (lam 0) look-ahead answers; the per-push share of the rate is lr / 1 here."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(6))
    soft = SoftSyncProgram(FakeHost(w0), softsync_options(n=WORKERS, staleness_lr=False, server_momentum="per-worker",
                                                          lookahead=True))
    dc = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, ms_momentum=0.95, lookahead=True))
    for i, worker in enumerate([3, 1, 0, 2, 1, 3, 0]):
        grad = gradients(7, seed=7)[i][worker]
        push(soft, worker, grad)
        push(dc, worker, grad)
        torch.testing.assert_close(soft.host.outbox[worker], dc.host.outbox[worker], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(soft.host.outbox[worker], _by_hand_lookahead(soft, 0.1, 0.9), rtol=1e-6,
                                   atol=1e-6)


def test_lookahead_sum_is_restored_from_a_state_dict_bit_for_bit():
    """The running sum of the buffers is saved: a program loaded from the state answers the next push
    exactly as the first does. From a state without it (a checkpoint of an older version) the sum is
    summed afresh from the buffers, in another order than the running one: equal up to rounding only."""
    w0 = torch.zeros(N)
    options = dict(lam=0.0, adaptive=False, ms_momentum=0.95, lookahead=True)
    first = DCProgram(FakeHost(w0), dc_options(**options))
    order = [0, 1, 2, 0, 3, 1, 2, 2, 0, 3, 1]
    for i, worker in enumerate(order):
        push(first, worker, gradients(len(order), seed=8)[i][worker])
    state = first.state_dict()
    exact = DCProgram(FakeHost(first.host.weights), dc_options(**options))
    exact.load_state_dict(state)
    older = DCProgram(FakeHost(first.host.weights), dc_options(**options))
    older.load_state_dict({k: v for k, v in state.items() if k != "lookahead_total"})
    assert torch.equal(exact.lookahead.total, first.lookahead.total)
    assert not torch.equal(older.lookahead.total, first.lookahead.total)  # the rounding the saved sum avoids
    torch.testing.assert_close(older.lookahead.total, first.lookahead.total, rtol=0, atol=1e-6)
    for program in (first, exact, older):
        program.host.version = first.host.version
        push(program, 3, torch.ones(N))
    assert torch.equal(exact.host.outbox[3], first.host.outbox[3])
    torch.testing.assert_close(older.host.outbox[3], first.host.outbox[3], rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("make", [lambda host: DCProgram(host, dc_options(lam=0.5, adaptive=True, ms_momentum=0.95)),
                                  lambda host: SoftSyncProgram(host, softsync_options(n=WORKERS, staleness_lr=False))],
                         ids=["dc-asgd", "softsync"])
def test_a_server_skips_a_non_finite_gradient_and_applies_the_next(make, bad):
    """The servers' own check (a worker that skipped its check, or a flipped bit on the way): the
    push is answered SKIPPED and leaves the weights as they were; a finite push then applies."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(3))
    program = make(FakeHost(w0))
    poisoned = torch.ones(N)
    poisoned[4] = bad
    push(program, 0, poisoned)
    assert program.host.skipped_nonfinite == 1
    assert program.host.answers[-1][2] is W.Status.SKIPPED
    assert torch.equal(program.host.weights, w0)
    push(program, 0, torch.ones(N))
    assert program.host.answers[-1][2] is W.Status.APPLIED
    assert torch.isfinite(program.host.weights).all() and not torch.equal(program.host.weights, w0)


@pytest.mark.parametrize("algorithm", ["dc-asgd", "softsync"])
def test_a_closed_workers_momentum_leaves_the_look_ahead(algorithm):
    """After worker 2 closes (or is dropped), the look-ahead's running sum is the sum of the others'
    buffers: the answers no longer carry the momentum of a worker that will never push again."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(4))
    if algorithm == "dc-asgd":
        program = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, ms_momentum=0.95, lookahead=True))
    else:
        program = SoftSyncProgram(FakeHost(w0), softsync_options(n=WORKERS, staleness_lr=False,
                                                                 server_momentum="per-worker", lookahead=True))
    rng = gradients(3, seed=5)
    for r in range(3):
        for worker in range(WORKERS):
            push(program, worker, rng[r][worker])
    buffers = lambda: [s["momentum_buffer"] for s in program.momentum if "momentum_buffer" in s]  # noqa: E731
    assert torch.allclose(program.lookahead.total, sum(buffers()), atol=1e-6)
    gone = program.momentum[2]["momentum_buffer"].clone()
    assert gone.abs().sum() > 0
    program.on_leave(2)
    program.on_close(2)
    remaining = sum(program.momentum[w]["momentum_buffer"] for w in (0, 1, 3))
    assert torch.allclose(program.lookahead.total, remaining, atol=1e-6), \
        (program.lookahead.total - remaining).abs().max()
    push(program, 0, rng[0][0])  # and the sum stays right as the others go on
    assert torch.allclose(program.lookahead.total, sum(buffers()), atol=1e-6)


def test_the_push_clip_reads_the_whole_gradients_norm_so_shards_scale_alike():
    """Two shards of one gradient: each server sees its slice only, but the clip scales both by the
    whole gradient's norm (sent with the push), so the applied step is parallel to the gradient. Here
    shard A's slice is as large as the first push's while shard B's grew tenfold: per-shard norms
    would clip B alone."""
    def clip_push(program, worker, grad, whole):
        h = np.zeros(W.H_LEN, dtype=np.float64)
        W.encode_request(h, W.Kind.PUSH, DCPayload(lr=0.1, grad_norm=whole).encode())
        program.host.inbox[worker].copy_(grad)
        program.on_request(worker, W.Request.decode(h, 0, worker))

    w0 = torch.zeros(N)
    shards = [DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, ms_momentum=0.95, push_clip=1.5)) for _ in range(2)]
    first = [torch.ones(N), torch.ones(N)]
    second = [torch.ones(N), 10 * torch.ones(N)]
    for program, g in zip(shards, first):
        clip_push(program, 0, g, float(torch.cat(first).norm()))
    before = [p.host.weights.clone() for p in shards]
    for program, g in zip(shards, second):
        clip_push(program, 1, g, float(torch.cat(second).norm()))
    steps = [b - p.host.weights for b, p in zip(before, shards)]
    scales = [float(step.norm() / (0.1 * g.norm())) for step, g in zip(steps, second)]
    assert scales[0] < 1.0, scales  # the push was clipped ...
    assert scales[0] == pytest.approx(scales[1], rel=1e-6), scales  # ... by one factor on both shards


def test_backup_sgd_applies_the_mean_of_the_first_n_minus_b_and_drops_the_late():
    """backup-sgd, 4 workers, 1 backup: each round the first 3 pushes on the current weights wait, unanswered,
    then make one step of torch's SGD (momentum 0.9, weight decay 0.01) with their mean; the 4th, computed
    on the weights before that step, is dropped: answered at once with the new weights, counted, not applied."""
    from hvd_async.algorithms.backup import BackupProgram, BackupSGDOptions

    w0 = torch.randn(N, generator=torch.Generator().manual_seed(4))
    program = BackupProgram(FakeHost(w0), BackupSGDOptions(backups=1))
    reference = torch.nn.Parameter(w0.clone())
    sgd = torch.optim.SGD([reference], lr=0.1, momentum=0.9, weight_decay=0.01)
    orders = [(2, 0, 3, 1), (1, 3, 0, 2), (0, 1, 2, 3)]
    for r, (order, grads) in enumerate(zip(orders, gradients(len(orders), seed=5))):
        for k, worker in enumerate(order[:3]):
            answered = len(program.host.answers)
            push(program, worker, grads[worker])
            if k < 2:  # waiting for the third: nothing answered, the weights as they were
                assert len(program.host.answers) == answered and program.host.version == r
        reference.grad = (grads[order[0]] + grads[order[1]] + grads[order[2]]) / 3
        sgd.step()
        torch.testing.assert_close(program.host.weights, reference.detach(), rtol=1e-5, atol=1e-6)
        assert program.host.version == r + 1
        assert sorted(a[0] for a in program.host.answers[-3:]) == sorted(order[:3])
        assert all(a[1:] == (0, W.Status.APPLIED) for a in program.host.answers[-3:])
        for worker in order[:3]:
            assert torch.equal(program.host.outbox[worker], program.host.weights)
        late, stepped = order[3], program.host.weights.clone()
        push(program, late, grads[late] * 1000)  # dropped: a huge gradient would show if applied
        assert program.host.answers[-1] == (late, 1, W.Status.DROPPED)
        assert torch.equal(program.host.weights, stepped) and torch.equal(program.host.outbox[late], stepped)
    assert program.dropped == [0, 1, 1, 1]  # late: worker 1, then 2, then 3
    assert program.state_dict()["dropped"] == [0, 1, 1, 1]


def test_backup_sgd_pushes_for_an_old_version_are_dropped_even_before_the_step():
    """A worker still on version 0 after a step pushes while version 1's step is half collected: dropped;
    the step then takes the first 3 pushes on version 1 (backups 1), the dropped one's gradient not among them."""
    from hvd_async.algorithms.backup import BackupProgram, BackupSGDOptions

    program = BackupProgram(FakeHost(torch.zeros(N)), BackupSGDOptions(backups=1))
    for worker in (0, 1, 2):
        push(program, worker, torch.ones(N))
    assert program.host.version == 1
    push(program, 0, torch.full((N,), 2.0))  # on version 1: accepted, waits
    push(program, 3, torch.full((N,), -50.0))  # still on version 0: dropped, answered at once
    assert program.host.answers[-1] == (3, 1, W.Status.DROPPED) and program.host.version == 1
    push(program, 3, torch.full((N,), 5.0))  # now on version 1: accepted
    before = program.host.weights.clone()
    push(program, 1, torch.full((N,), 8.0))  # the third on version 1: the step
    assert program.host.version == 2
    # lr 0.1, momentum 0.9, weight decay 0.01: buf = 0.9 * buf + mean + wd * w
    buf = 0.9 * (1.0 + 0.0) + 5.0 + 0.01 * before
    torch.testing.assert_close(program.host.weights, before - 0.1 * buf)
    assert program.dropped == [0, 0, 0, 1]


def test_backup_sgd_steps_with_every_active_worker_when_fewer_push():
    """Workers going idle (an epoch's end) do not leave the others waiting: with 2 of 4 left, the 2
    gradients in make the step; backups=0 with everyone pushing is the mean of all 4 (ssgd's)."""
    from hvd_async.algorithms.backup import BackupProgram, BackupSGDOptions

    program = BackupProgram(FakeHost(torch.zeros(N)), BackupSGDOptions(backups=1))
    idle = W.Request(W.Kind.IDLE, np.zeros(W.PAYLOAD_LEN))
    push(program, 0, torch.ones(N))
    push(program, 1, torch.full((N,), 3.0))
    program.on_request(3, idle)
    assert program.host.version == 0 and program.waiting_on() == {2}
    program.on_request(2, idle)
    assert program.host.version == 1 and not program.waiting_on()
    torch.testing.assert_close(program.host.weights, torch.full((N,), -0.2))  # - 0.1 * (1 + 3) / 2
    sync = BackupProgram(FakeHost(torch.zeros(N)), BackupSGDOptions(backups=0))
    for worker in (3, 1, 0, 2):
        push(sync, worker, torch.full((N,), float(worker)))
    torch.testing.assert_close(sync.host.weights, torch.full((N,), -0.15))  # - 0.1 * mean(0, 1, 2, 3)
    push(sync, 0, torch.ones(N))
    with pytest.raises(RuntimeError, match="wait for the update"):
        sync.state_dict()


def test_the_snapshot_sends_no_unanswered_request_after_its_last_answered_one():
    """mailbox_snapshot: IDLE and RESUME are not answered, and a server takes different workers'
    requests in any order; a RESUME sent after the last answered request could reach a shard after
    another worker's next push, which a synchronous rule would then apply alone as a whole round.
    So before the final barrier, the last request must be an answered one (the PULL)."""
    from hvd_async.algorithms.ps import mailbox_snapshot

    calls = []

    class Recording:
        def request_async(self, kind, **kwargs):
            calls.append(kind)
            return SimpleNamespace(wait=lambda: None)

        def barrier(self):
            calls.append("barrier")

    mailbox_snapshot(Recording(), torch.zeros(3), while_idle=lambda: calls.append("while_idle"))
    assert calls[-1] == "barrier" and calls[0] is W.Kind.IDLE and calls[1] == "barrier"
    requests = [c for c in calls[2:] if isinstance(c, W.Kind)]
    assert set(requests) == {W.Kind.RESUME, W.Kind.PULL}
    assert requests[-1].answered, f"unanswered {requests[-1].name} last before the barrier: {calls}"


# --- one momentum buffer shared by every push (momentum='shared', dc-asgd and lc-asgd) -------------------

def test_shared_momentum_steps_every_push_through_one_buffer():
    """lam 0, no look-ahead: each push is ``v <- 0.9 v + (g + wd w)``, ``w <- w - lr v`` on one ``v``,
    whichever worker pushed (per-worker buffers would keep four)."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(6))
    dc = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, server_momentum="shared"))
    reference, state = w0.clone(), {}
    order = [0, 1, 0, 2, 3, 1]
    rng = gradients(len(order), seed=7)
    for i, worker in enumerate(order):
        push(dc, worker, rng[i][worker])
        SGDRule().apply_(reference, rng[i][worker], state, lr=0.1, momentum=0.9, weight_decay=0.01)
        assert torch.equal(dc.host.outbox[worker], dc.host.weights)
    assert dc.momentum is None and torch.equal(dc.host.weights, reference)


def test_shared_momentum_looks_ahead_over_the_next_pushes():
    """With the look-ahead, a push is answered with ``w - lr * (0.9 + 0.9**2 + ... + 0.9**P) * v``, P the
    workers pushing; the servers' weights are those of the plain program."""
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(8))
    ahead = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, server_momentum="shared", lookahead=True))
    plain = DCProgram(FakeHost(w0), dc_options(lam=0.0, adaptive=False, server_momentum="shared"))
    order = [0, 1, 0, 2, 3, 1, 2]
    rng = gradients(len(order), seed=9)
    for i, worker in enumerate(order):
        push(ahead, worker, rng[i][worker])
        push(plain, worker, rng[i][worker])
        assert torch.equal(ahead.host.weights, plain.host.weights)
        carried = 0.1 * sum(0.9 ** j for j in range(1, WORKERS + 1))  # every worker is pushing
        expected = ahead.host.weights - carried * ahead.sgd_state["momentum_buffer"]
        torch.testing.assert_close(ahead.host.outbox[worker], expected, rtol=0, atol=1e-6)
    ahead.on_leave(3)  # worker 3 stops pushing (an IDLE request): P is 3
    push(ahead, 0, torch.ones(N))
    expected = ahead.host.weights - 0.1 * (0.9 + 0.81 + 0.729) * ahead.sgd_state["momentum_buffer"]
    torch.testing.assert_close(ahead.host.outbox[0], expected, rtol=0, atol=1e-6)


def test_shared_momentum_resumes_exactly_and_refuses_the_other_kind():
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(10))
    options = dc_options(lam=2.0, adaptive=True, server_momentum="shared", lookahead=True)
    first = DCProgram(FakeHost(w0), options)
    for i, worker in enumerate([0, 1, 2, 0, 3]):
        push(first, worker, gradients(5, seed=11)[i][worker])
    saved = first.state_dict()
    second = DCProgram(FakeHost(first.host.weights), options)
    second.load_state_dict(saved)
    second.host.version = first.host.version
    for slot, kept in zip(second.host.outbox, first.host.outbox):  # (in place, as the host restores them)
        slot.copy_(kept)
    for program in (first, second):
        push(program, 1, torch.ones(N))
    assert torch.equal(first.host.weights, second.host.weights)
    assert torch.equal(first.host.outbox[1], second.host.outbox[1])
    per_worker = DCProgram(FakeHost(w0), dc_options(lam=2.0, adaptive=True, lookahead=True))
    with pytest.raises(ValueError, match="--server-momentum shared"):
        per_worker.load_state_dict(saved)


def test_softsync_keeps_an_outbox_only_where_answers_differ_per_worker():
    """The per-worker look-ahead answers each worker its own point; one shared buffer (or none ahead)
    answers the weights themselves, which the pushers read from the weights window; fp16 keeps the
    half-precision answer."""
    from hvd_async.algorithms.softsync import SoftSyncAlgorithm

    assert SoftSyncAlgorithm.outbox_for(SoftSyncOptions())
    assert not SoftSyncAlgorithm.outbox_for(SoftSyncOptions(server_momentum="shared"))
    assert not SoftSyncAlgorithm.outbox_for(SoftSyncOptions(lookahead=False))
    assert SoftSyncAlgorithm.outbox_for(SoftSyncOptions(server_momentum="shared", compression="fp16"))


def test_softsyncs_old_momentum_name_still_works_with_a_warning():
    """softsync's ``momentum`` became ``server_momentum`` (dc-asgd's and lc-asgd's name): the old keyword
    and flag still set it, with a FutureWarning naming the new one; the two saying different things is
    refused."""
    from hvd_async.job import config

    with pytest.warns(FutureWarning, match=r"use server_momentum='shared' \(--server-momentum\)") as caught:
        old = SoftSyncOptions(momentum="shared")
    assert old.server_momentum == "shared" and old.shared_momentum and old.momentum is None
    assert [w.filename for w in caught] == [__file__], "the warning names the caller's line, not the package's"
    with pytest.warns(FutureWarning):
        assert SoftSyncOptions(momentum="shared", server_momentum="shared").server_momentum == "shared"
    with pytest.raises(ValueError, match="momentum='per-worker' and server_momentum='shared' say two things"):
        SoftSyncOptions(momentum="per-worker", server_momentum="shared")
    with pytest.raises(ValueError, match="momentum must be .per-worker. or .shared. .and name it server_momentum"):
        SoftSyncOptions(momentum="both")
    with pytest.warns(FutureWarning, match="--softsync-momentum"):  # the job's validation builds the options
        spec = config.validate(config.parse(["--algo", "softsync", "--np", "5", "--softsync-momentum", "shared"]))
    with pytest.warns(FutureWarning):
        assert SoftSyncOptions(**spec.algorithm.given).server_momentum == "shared"
    spec = config.validate(config.parse(["--algo", "softsync", "--np", "5", "--server-momentum", "shared"]))
    assert SoftSyncOptions(**spec.algorithm.given).server_momentum == "shared"
