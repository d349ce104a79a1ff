"""backup-sgd under mpirun, run by tests/test_backup_sgd.py: ``SERVERS=S python backup_checks.py [CHECK ...]``.

Each round b workers are made late on purpose: they push only after the others' step has been
applied (a token from a worker whose step returned), so the first ``workers - b`` pushes are known.
The checks compare every worker's weights with torch's SGD on the mean of those pushes, and the
drop counts with the schedule; worker 0 prints ``BACKUP CHECKS OK`` at the end. ``INBOX_SLOTS``:
the servers' inbox slots (fewer than the workers: a pool the pushes claim). ``SERVER_KERNEL``: how the
servers apply an update (``compiled``: the one loop that reads the round's gradients from the inbox
slots they wait in; the default, ``auto``, is the eager chain on this small shard).
"""
import os
import sys

import numpy as np
import torch

import hvd_async as ha
from harness import check, main
from hvd_async.algorithms.payload import SGDPayload
from hvd_async.transport import window as W

NUMEL, ROUNDS, LR, MOMENTUM, WEIGHT_DECAY = 1001, 5, 0.5, 0.9, 0.01
TAG_TOKEN = 4711


def _grads(rounds, workers, seed=9):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randint(-4, 5, (NUMEL,), generator=gen).float() for _ in range(workers)] for _ in range(rounds)]


def _late(r, workers, backups):
    """The workers that push after round ``r``'s step: ``backups`` of them, a different set each round."""
    return sorted((r + j) % workers for j in range(backups))


def _run(backups):
    """ROUNDS rounds with ``backups`` late workers each; returns the optimizer (open) and the expected weights."""
    workers, rank, comm = ha.size(), ha.rank(), ha.worker_comm()
    init = (torch.arange(NUMEL) % 11).float() - 5.0
    param = torch.nn.Parameter(init.clone())
    opt = ha.DistributedOptimizer(torch.optim.SGD([param], lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
                                  named_parameters=[("w", param)], algorithm="backup-sgd", backups=backups,
                                  inbox_slots=int(os.environ.get("INBOX_SLOTS", "8")),
                                  server_kernel=os.environ.get("SERVER_KERNEL", "auto"))
    slots = opt.strategy.transport.spec
    check(slots.pooled == (int(os.environ.get("INBOX_SLOTS", "8")) < workers), f"the pool is as asked: {slots}")
    opt.begin()  # collective: before a late worker waits for its token
    reference = torch.nn.Parameter(init.clone().double())
    sgd = torch.optim.SGD([reference], lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    grads = _grads(ROUNDS, workers)
    for r in range(ROUNDS):
        late = _late(r, workers, backups)
        on_time = [m for m in range(workers) if m not in late]
        param.grad = grads[r][rank].clone()
        if rank in late:  # wait until the step is applied, then push the gradient of the old weights
            comm.recv(source=on_time[0], tag=TAG_TOKEN)
            opt.step()  # dropped: answered at once (the others wait in the barrier, pushing nothing)
        else:
            opt.step()  # returns once the first workers - backups pushes made the step
            if rank == on_time[0]:
                for m in late:
                    comm.send(r, dest=m, tag=TAG_TOKEN)
        comm.Barrier()
        reference.grad = sum(grads[r][m].double() for m in on_time) / len(on_time)
        sgd.step()
        check(torch.allclose(param.detach().double(), reference.detach(), rtol=1e-5, atol=1e-5),
              f"backups={backups} round {r}: worker {rank}'s weights are off the mean of workers {on_time} "
              f"by {(param.detach().double() - reference.detach()).abs().max():.3e}")
    return opt, reference.detach()


def first_n_minus_b():
    """At backups 0, 1 and workers - 1: the weights after each round are torch's SGD step on the mean of
    the on-time workers' gradients on every worker; each late push was dropped and counted."""
    workers, rank = ha.size(), ha.rank()
    for backups in sorted({0, 1, workers - 1}):
        opt, _ = _run(backups)
        late_rounds = sum(rank in _late(r, workers, backups) for r in range(ROUNDS))
        stats = opt.stats()
        check(stats["dropped"] == late_rounds, f"backups={backups}: worker {rank} counted {stats['dropped']} "
              f"drops, {late_rounds} expected")
        check(stats["pushes"] == ROUNDS - late_rounds and stats["staleness_max"] == 0,
              f"backups={backups}: worker {rank}'s applied pushes {stats}")
        check(stats["dropped_pushes"] == ROUNDS * backups, f"backups={backups}: the servers dropped "
              f"{stats['dropped_pushes']} pushes, {ROUNDS * backups} expected")
        for k, row in enumerate(opt.strategy.transport.read_stats()):
            check(row["version"] == ROUNDS and row["pushes"] == ROUNDS * (workers - backups)
                  and row["sums"][0] == ROUNDS * backups,
                  f"backups={backups}: shard {k} counted version {row['version']}, pushes {row['pushes']}, "
                  f"drops {row['sums'][0]}")
        opt.load_global_model()
        opt.close()


def default_and_bad_values():
    """The default is one backup; backups outside 0 .. workers - 1 fail on every worker, before any window opens."""
    workers = ha.size()
    param = torch.nn.Parameter(torch.zeros(3))

    def make(**options):
        return ha.DistributedOptimizer(torch.optim.SGD([param], lr=0.1), named_parameters=[("w", param)],
                                       algorithm="backup-sgd", **options)

    for bad, says in ((workers, f"backups {workers} must be between 0 and the number of workers minus 1 "
                                f"({workers - 1})"), (-1, "backups must be an integer from 0 to workers - 1")):
        try:
            make(backups=bad)
            check(False, f"backups={bad} was accepted")
        except ValueError as exc:
            check(says in str(exc), f"error {str(exc)!r} does not say {says!r}")
    opt = make()
    check(opt.strategy.options.backups == 1, f"default backups {opt.strategy.options.backups}")
    opt.close()


def answers_say_dropped():
    """Over the transport alone: a push on an old version is answered DROPPED with staleness 1 and the
    current weights, without waiting for anything."""
    workers, rank, comm = ha.size(), ha.rank(), ha.worker_comm()
    t = W.WindowTransport(NUMEL, comms=ha.runtime.comms(), algorithm="backup-sgd", mode="mailbox",
                          options={"backups": 1})
    flat = torch.ones(NUMEL)
    t.publish_(flat)
    if rank != workers - 1:
        answers = t.push(torch.ones(NUMEL), flat, SGDPayload(lr=1.0).encode())  # lr 1: the mean of ones, one step
        check(answers.all(W.Status.APPLIED) and (answers.versions == 1).all(), f"on time: {answers.rows}")
        if rank == 0:
            comm.send(0, dest=workers - 1, tag=TAG_TOKEN)
    else:
        comm.recv(source=0, tag=TAG_TOKEN)
        answers = t.push(torch.full((NUMEL,), 100.0), flat, SGDPayload(lr=1.0).encode())
        check(answers.all(W.Status.DROPPED) and (answers.staleness == 1).all() and (answers.versions == 1).all(),
              f"late: {answers.rows}")
    check(np.array_equal(flat.numpy(), np.zeros(NUMEL, dtype=np.float32)), f"worker {rank} holds {flat[:4]}")
    comm.Barrier()
    t.close()


CHECKS = {f.__name__: f for f in (default_and_bad_values, answers_say_dropped, first_n_minus_b)}


if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "BACKUP CHECKS OK")
