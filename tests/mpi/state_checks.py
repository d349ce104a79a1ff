"""Checkpoint state under mpirun (tests/test_checkpoint_resume.py): ``SERVERS=S python state_checks.py [CHECK ...]``.

For every algorithm: train a few steps, ``synchronize()``, take ``state_dict()``; train on (the
servers' weights, counters, momentum buffers, backups and predictors all move), ``synchronize()``,
``load_state_dict()`` the saved state on every worker; the state then read back equals the saved one
exactly, servers included. Worker 0 prints ``STATE CHECKS OK ...``.
"""
import copy
from dataclasses import fields
import os
import shutil
import sys
import tempfile

import torch

import hvd_async as ha
from hvd_async import registry
from harness import check, main

OWN_OPTIONS = {  # options that make every piece of state non-trivial, where the defaults do not
    "dbs-asgd": {"batch_size": 8, "every": 2}, "dc-asgd": {"lam": 0.5, "adaptive": True},
    "lc-asgd": {"lam": 0.1, "predictor": "mlp", "min_history": 2,
                "predictor_options": {"warmup_steps": 1, "context": 3, "window": 8}},
    "softsync": {"n": 1}, "od-sgd": {"local_momentum": 0.5}, "easgd": {"tau": 2}, "hpsgd": {"window": 2},
    "gossip": {"variant": "push"}, "backup-sgd": {"backups": 1}, "lb-sgd": {"batch_size": 8, "every": 2},
}
SERVERLESS = registry.serverless()
# every algorithm of the registry, those on servers first (in a job with server ranks the first optimizer
# must use them: hvd_async refuses to leave them idle)
OPTIONS = {name: OWN_OPTIONS.get(name, {}) for name in sorted(registry.NAMES, key=lambda n: n in SERVERLESS)}


def same(a, b, where="state"):
    """Raise naming the first place where two nested states differ (tensors compared exactly)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        check(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
              and a.dtype == b.dtype and torch.equal(a, b), f"{where}: tensors differ")
    elif isinstance(a, dict):
        check(isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs "
              f"{sorted(map(str, b)) if isinstance(b, dict) else type(b)}")
        for key in a:
            same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        check(isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        check(a == b, f"{where}: {a!r} != {b!r}")


def servers_of(state):
    strategy = state["algorithm"]["strategy"]
    return strategy["servers"] if "servers" in strategy else strategy["exchange"]["servers"]


def train(opt, model, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=gen)
        y = torch.randint(0, 3, (8,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step(loss=loss.detach())


def full_state(opt):
    """The optimizer's state (torch's format) and the algorithm's (counters, server shards)."""
    return {"optimizer": opt.state_dict(), "algorithm": opt.algorithm_state_dict()}


def round_trip(algorithm):
    def run():
        rank = ha.rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        options = dict(OPTIONS[algorithm])
        if algorithm == "od-sgd" and ha.num_servers() == 0:
            options["exchange"] = "allreduce"
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                      named_parameters=model.named_parameters(), algorithm=algorithm, **options)
        train(opt, model, 7, seed=100 + rank)
        opt.load_global_model()
        saved = full_state(opt)
        ha.worker_comm().Barrier()  # nobody pushes while worker 0 reads the servers
        with_servers = algorithm not in SERVERLESS and ha.num_servers() > 0
        saved_model = {k: v.clone() for k, v in model.state_dict().items()}
        if rank == 0 and with_servers:
            check(len(servers_of(saved)) == ha.num_servers(), "worker 0 holds every shard")
        train(opt, model, 5, seed=200 + rank)
        opt.load_global_model()
        moved = full_state(opt)
        ha.worker_comm().Barrier()
        if rank == 0 and with_servers:
            try:
                same(servers_of(saved), servers_of(moved))
                check(False, f"{algorithm}: the servers' state did not move in 5 more steps")
            except AssertionError as exc:
                check("did not move" not in str(exc), str(exc))
        model.load_state_dict(saved_model)
        opt.load_state_dict(saved["optimizer"])
        opt.load_algorithm_state_dict(saved["algorithm"])
        same(saved, full_state(opt), f"{algorithm} state after load")
        for name, value in model.state_dict().items():
            check(torch.equal(value, saved_model[name]), f"{algorithm}: model {name} changed by the load")
        ha.worker_comm().Barrier()  # worker 0 has read the servers before anyone pushes again
        train(opt, model, 2, seed=300 + rank)  # it trains on from there
        opt.load_global_model()
        opt.close()
    return run


def other_slots():
    """A state saved with one inbox slot per worker loads exactly into servers with a pool of one
    slot (the pool holds nothing between pushes), and the job trains on."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    states = []
    for slots in (0, 1):
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                      named_parameters=model.named_parameters(), algorithm="dc-asgd",
                                      lam=0.5, inbox_slots=slots)
        check(opt.strategy.transport.spec.pooled == (slots == 1 and ha.size() > 1), "the pool is as asked")
        if states:
            opt.load_state_dict(states[0]["optimizer"])
            opt.load_algorithm_state_dict(states[0]["algorithm"])
            same(states[0], full_state(opt), "dc-asgd state loaded into a pool of one slot")
        ha.worker_comm().Barrier()
        train(opt, model, 7, seed=100 + ha.rank())
        opt.load_global_model()
        states.append(full_state(opt))
        ha.worker_comm().Barrier()
        opt.close()


def unbusy(state):
    """``state`` with every shard's busy time (a statistic of the server's, which a request landing
    between two takes moves on) set to 0, in copies."""
    from hvd_async.transport.window import META_BUSY_US

    if isinstance(state, dict):
        out = {key: unbusy(value) for key, value in state.items()}
        if isinstance(out.get("meta"), torch.Tensor):
            out["meta"] = out["meta"].clone()
            out["meta"][META_BUSY_US] = 0
        return out
    if isinstance(state, (list, tuple)):
        return type(state)(unbusy(value) for value in state)
    return state


def streamed():
    """Each server writes its own shard (``shard_dir``): worker 0's state names the files, which hold
    exactly what the gathered state holds; training on and loading the files back restores the
    servers exactly, also into servers with a pool of one inbox slot; without the folder the load is
    refused."""
    from hvd_async import checkpoint
    from hvd_async.transport.window.host import SHARD_KIND

    comm = ha.worker_comm()
    folder = comm.bcast(tempfile.mkdtemp(prefix="hvd-async-shards-") if ha.rank() == 0 else None, root=0)
    for algorithm in [a for a in OPTIONS if a not in SERVERLESS]:
        for slots in (0, 1):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
            options = dict(OPTIONS[algorithm], **({"inbox_slots": slots} if slots else {}))
            if slots and "inbox_slots" not in {f.name for f in fields(registry.algorithm(algorithm).Options)}:
                continue
            opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                          named_parameters=model.named_parameters(), algorithm=algorithm,
                                          **options)
            train(opt, model, 7, seed=100 + ha.rank())
            opt.load_global_model()
            gathered = opt.algorithm_state_dict()
            comm.Barrier()
            files = opt.algorithm_state_dict(shard_dir=folder)
            comm.Barrier()
            if ha.rank() == 0:
                names = [entry.get("shard_file") for entry in servers_of({"algorithm": files})]
                check(names == [f"shard-{k}.pt" for k in range(ha.num_servers())], f"{algorithm}: {names}")
                for name, shard in zip(names, servers_of({"algorithm": gathered})):
                    written = checkpoint.load(os.path.join(folder, name), kind=SHARD_KIND)
                    same(unbusy(shard), unbusy(written), f"{algorithm} {name}")
            train(opt, model, 3, seed=200 + ha.rank())
            opt.load_global_model()
            if ha.rank() == 0:
                try:
                    opt.strategy.transport.load_server_state(servers_of({"algorithm": files}))
                    check(False, f"{algorithm}: loaded the files' names without their folder")
                except ValueError as exc:
                    check("load it with shard_dir" in str(exc), str(exc))
            opt.load_algorithm_state_dict(files, shard_dir=folder)
            same(unbusy(gathered), unbusy(opt.algorithm_state_dict()),
                 f"{algorithm} (inbox_slots={slots}) after loading the files")
            comm.Barrier()
            train(opt, model, 2, seed=300 + ha.rank())
            opt.load_global_model()
            opt.close()
    comm.Barrier()
    if ha.rank() == 0:
        shutil.rmtree(folder)


def resume_exact():
    """With the look-ahead on (asgd's previous pull, dc-asgd's and lc-asgd's running sum of the servers'
    momentum buffers), training on from a loaded state repeats training on from the saved one bit for
    bit. The workers push in turn (one step each, a barrier between), so the pushes' order is fixed."""
    comm = ha.worker_comm()
    for algorithm in ("asgd", "dc-asgd", "lc-asgd"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                      named_parameters=model.named_parameters(), algorithm=algorithm,
                                      **OPTIONS[algorithm])

        def steps(seed):
            for step in range(4):
                for turn in range(comm.size):
                    if ha.rank() == turn:
                        train(opt, model, 1, seed=seed + 10 * step + turn)
                    comm.Barrier()
            opt.load_global_model()
            return [p.detach().clone() for p in model.parameters()]

        opt.load_global_model()  # (the first exchange is collective: met here, not while the others wait their turn)
        steps(100)
        saved_model = {k: v.clone() for k, v in model.state_dict().items()}
        saved = copy.deepcopy(full_state(opt))  # (torch's state_dict holds the live momentum buffers)
        comm.Barrier()
        once = steps(200)
        model.load_state_dict(saved_model)
        opt.load_state_dict(saved["optimizer"])
        opt.load_algorithm_state_dict(saved["algorithm"])
        comm.Barrier()
        again = steps(200)
        for a, b in zip(once, again):
            check(torch.equal(a, b), f"{algorithm}: training on from the loaded state moved off the first run "
                                     f"by {(a - b).abs().max().item():.3e}")
        opt.close()


def foreign_state():
    """Another algorithm's state, or another server count's, is refused with a clear message."""
    model = torch.nn.Linear(6, 3)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                  algorithm="dc-asgd")
    opt.load_global_model()
    state = opt.algorithm_state_dict()
    wrong = dict(state, algorithm="asgd")
    try:
        opt.load_algorithm_state_dict(wrong)
        check(False, "loaded another algorithm's state")
    except ValueError as exc:
        check("from algorithm 'asgd'" in str(exc), str(exc))
    if ha.rank() == 0:
        servers = state["strategy"]["servers"]
        try:
            opt.strategy.transport.load_server_state(servers + servers)
            check(False, "loaded twice the shards")
        except ValueError as exc:
            check(f"has {2 * len(servers)} shard(s), this job has {len(servers)}" in str(exc), str(exc))
        shard = dict(servers[0], weights=servers[0]["weights"][:-1])
        try:
            opt.strategy.transport.load_server_state([shard] + servers[1:])
            check(False, "loaded a shard of another size")
        except ValueError as exc:
            check("the checkpoint is from another model or server count" in str(exc), str(exc))
    opt.load_global_model()
    opt.close()


if __name__ == "__main__":
    names = [n for n in sys.argv[1:]]
    with_servers = int(os.environ.get("SERVERS", "1")) > 0
    algorithms = [a for a in OPTIONS if with_servers or a in SERVERLESS + ("od-sgd",)]
    checks = {a: round_trip(a) for a in algorithms}
    if with_servers:
        checks["other_slots"] = other_slots
        checks["foreign_state"] = foreign_state
        checks["streamed"] = streamed
        checks["resume_exact"] = resume_exact
    main(checks, names, "STATE CHECKS OK")
