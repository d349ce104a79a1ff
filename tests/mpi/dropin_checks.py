"""Horovod's own idioms against hvd_async's DistributedOptimizer, under mpirun (tests/test_dropin.py).

A Horovod script keeps its ``hvd.broadcast_parameters``, ``hvd.broadcast_optimizer_state``, its
rank-0 checkpoint load, its gradient clipping, its options; each check runs them under every
algorithm where they mean something and asserts the weights every worker (and every server) holds.
Run: ``SERVERS=1 mpirun -np 4 python tests/mpi/dropin_checks.py [check ...]``.
"""
import io
import os
import sys
import warnings

import horovod.torch as hvd
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, main  # noqa: E402

import hvd_async as ha  # noqa: E402
from hvd_async import registry  # noqa: E402

SERVER_ALGOS = tuple(name for name in registry.NAMES if name not in registry.serverless())
OPTIONS = {"hpsgd": {"window": 2}, "gossip": {"variant": "pull"}, "dbs-asgd": {"batch_size": 8}, "lb-sgd": {"batch_size": 8},
           "backup-sgd": {"backups": 0}}  # (no push dropped by timing: every worker's rows train in sparse_embeddings)
# the optimizers torch ships that a worker-side algorithm runs as they are (and Horovod broadcasts)
LOCAL_OPTIMIZERS = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "RMSprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5),
    "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.01),
}


def algorithms():
    """With servers, a parameter-server algorithm first: a job whose servers no optimizer has used refuses
    one without servers (they would sit idle)."""
    return SERVER_ALGOS + registry.serverless() if ha.num_servers() else registry.serverless()


def runs_any_optimizer(algorithm):
    return ha.registry.algorithm(algorithm).runs_user_optimizer


def model_for(rank_seed: int):
    torch.manual_seed(rank_seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def everyone_equal(t: torch.Tensor, what: str) -> None:
    gathered = ha.worker_comm().allgather(t.detach().clone())
    for i, other in enumerate(gathered):
        check(torch.equal(gathered[0], other), f"{what}: worker {i} holds {other[:4]} but worker 0 {gathered[0][:4]}")


def batch(seed: int, n: int = 8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def train(opt, model, steps: int, seed: int) -> None:
    for s in range(steps):
        x, y = batch(seed * 1000 + s)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss.detach())


def build(algorithm, model, make=LOCAL_OPTIMIZERS["SGD"], **extra):
    return ha.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                   algorithm=algorithm, **OPTIONS.get(algorithm, {}), **extra)


# --- the checks ------------------------------------------------------------------------------------

def broadcast():
    """Horovod's start: different weights on every worker, the optimizer built, then
    broadcast_parameters and broadcast_optimizer_state: every worker and the servers hold worker 0's
    weights; optimizer state trained apart is made equal; torch's state_dict format throughout."""
    rank = ha.rank()
    for algorithm in algorithms():
        makes = LOCAL_OPTIMIZERS if runs_any_optimizer(algorithm) else {"SGD": LOCAL_OPTIMIZERS["SGD"]}
        for opt_name, make in makes.items():
            what = f"{algorithm}/{opt_name}"
            model = model_for(100 + rank)  # a different start on every worker
            opt = build(algorithm, model, make)
            check(set(opt.state_dict()) == {"state", "param_groups"}, f"{what}: state_dict {set(opt.state_dict())}")
            if rank == 0:  # worker 0's weights change after the optimizer was built (a checkpoint load)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            root = ha.worker_comm().bcast(flat(model) if rank == 0 else None, root=0)
            check(torch.equal(flat(model), root), f"{what}: parameters differ from worker 0's after the broadcast")
            opt.load_global_model()  # the servers' weights (or centre, average): the broadcast ones
            check(torch.allclose(flat(model), root, atol=1e-6), f"{what}: global weights differ from the broadcast")
            train(opt, model, 2, seed=rank)  # optimizer state (momentum, moments) now differs per worker
            opt.load_global_model()
            if rank == 1:
                opt.param_groups[0]["lr"] = 0.123  # hyperparameters are broadcast too
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            check(opt.param_groups[0]["lr"] != 0.123, f"{what}: lr not broadcast")
            for key, state in sorted(opt.state_dict()["state"].items()):
                for name, value in sorted(state.items()):
                    if torch.is_tensor(value):
                        everyone_equal(value.reshape(-1).float(), f"{what}: optimizer state {key}/{name}")
            everyone_equal(flat(model), f"{what}: weights after load_global_model")
            opt.close()


def rank0_load():
    """Horovod's checkpoint pattern: load on worker 0 only (a local call: no hang), then broadcast:
    every worker and every server shard hold the checkpoint's weights."""
    rank = ha.rank()
    for algorithm in algorithms():
        model = model_for(7)
        opt = build(algorithm, model)
        train(opt, model, 3, seed=rank)
        opt.load_global_model()
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
        saved = flat(model).clone()
        opt.close()
        fresh = model_for(200 + rank)
        opt = build(algorithm, fresh)
        if rank == 0:
            buf.seek(0)
            ckpt = torch.load(buf)
            fresh.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        hvd.broadcast_parameters(fresh.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        saved = ha.worker_comm().bcast(saved, root=0)
        opt.load_global_model()
        check(torch.allclose(flat(fresh), saved, atol=1e-6),
              f"{algorithm}: after rank-0 load and broadcast the global weights are not the checkpoint's")
        train(opt, fresh, 1, seed=rank)
        opt.close()


def _grads_of(model, seeds, passes=1):
    """The summed gradients of ``passes`` backward passes of each seed's batch, at the model's weights
    (each worker computes every worker's gradients, to know the expected result exactly)."""
    out = []
    for seed in seeds:
        model.zero_grad()
        for k in range(passes):
            x, y = batch(seed * 10 + k)
            F.cross_entropy(model(x), y).backward()
        out.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]))
    model.zero_grad()
    return out


def _expected(algorithm, w0, grads, lr, clip=None):
    """ssgd: one step of the averaged (then clipped) gradient; asgd: every worker's own (clipped)
    gradient step, times 1 / workers (push_rate 'average'), added into the global weights."""
    def clipped(g):
        if clip is None:
            return g
        return g * min(1.0, clip / (float(g.norm()) + 1e-6))
    if algorithm == "ssgd":
        return w0 - lr * clipped(sum(grads) / len(grads))
    return w0 - lr * sum(clipped(g) for g in grads) / len(grads)


def clipping_and_accumulation():
    """opt.synchronize(); clip_grad_norm_; with opt.skip_synchronize(): opt.step() (Horovod's clipping
    pattern), and backward_passes_per_step=2, against the hand-computed weights."""
    rank, n, lr = ha.rank(), ha.size(), 0.1
    for algorithm in ("asgd", "ssgd") if ha.num_servers() else ("ssgd",):
        for passes, clip in ((1, 0.05), (2, None)):
            model = model_for(3)
            w0 = flat(model).clone()
            grads = _grads_of(model_for(3), range(n), passes)
            opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                          named_parameters=model.named_parameters(), algorithm=algorithm,
                                          backward_passes_per_step=passes)
            opt.zero_grad()
            for k in range(passes):
                x, y = batch(rank * 10 + k)
                F.cross_entropy(model(x), y).backward()
            if clip is not None:
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
            opt.load_global_model()
            want = _expected(algorithm, w0, grads, lr, clip)
            check(torch.allclose(flat(model), want, atol=1e-5),
                  f"{algorithm} passes={passes} clip={clip}: weights off by {float((flat(model) - want).abs().max()):.2e}")
            opt.close()


def step_after_synchronize_warns():
    """Horovod's warning, in its words, once per step() after synchronize() outside skip_synchronize()."""
    for algorithm in ("asgd", "ssgd") if ha.num_servers() else ("ssgd",):
        model = model_for(1)
        opt = build(algorithm, model)
        x, y = batch(ha.rank())
        for explicit_skip in (False, False, True):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if explicit_skip:
                    with opt.skip_synchronize():
                        opt.step()
                else:
                    opt.step()
            said = [str(w.message) for w in caught if "skip_synchronize" in str(w.message)]
            want = [] if explicit_skip else [ha.optimizer.STEP_AFTER_SYNCHRONIZE]
            check(said == want, f"{algorithm}: warning {said} with skip_synchronize={explicit_skip}")
        opt.close()


def options():
    """Horovod's options: fp16 compression under ssgd (within fp16's rounding of the average), Sum,
    the predivide factor; one clear line where an algorithm gives an option no meaning."""
    rank, n = ha.rank(), ha.size()
    for kw, tol in (({"compression": hvd.Compression.fp16}, 2e-3), ({"op": hvd.Sum}, 1e-6),
                    ({"gradient_predivide_factor": 4.0}, 1e-6), ({"process_set": hvd.global_process_set}, 1e-6)):
        model = model_for(5)
        w0 = flat(model).clone()
        grads = _grads_of(model_for(5), range(n))
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), algorithm="ssgd", **kw)
        x, y = batch(rank * 10)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        avg = sum(grads) / (1 if "op" in kw else n)
        check(torch.allclose(flat(model), w0 - 0.1 * avg, atol=tol), f"ssgd {kw}: weights off")
        opt.close()
    if ha.num_servers():
        model = model_for(5)
        works = {name: ", ".join(sorted(algos)) for name, algos in ha.wrapping.where_supported().items()}
        assert "ssgd" in works["compression"] and "ssgd" in works["op"] and "asgd" not in works["op"].split(", ")
        for kw, says in (({"compression": hvd.Compression.fp16},
                          f"compression='fp16' has no meaning under asgd; it works with: {works['compression']}"),
                         ({"op": hvd.Sum}, f"op='sum' has no meaning under asgd; it works with: {works['op']}"),
                         ({"op": hvd.Adasum}, "op=hvd.Adasum is not supported by hvd_async")):
            try:
                ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters(), algorithm="asgd", **kw)
                check(False, f"asgd accepted {kw}")
            except ValueError as exc:
                check(says in str(exc), str(exc))


def fp16_through_the_windows():
    """compression=fp16 under the server-side rules: gradients go up and weights come back in fp16
    (the servers keep fp32): the weights are the fp32 run's within fp16's rounding, and not equal to
    them (the fp16 path was taken)."""
    if not ha.num_servers():
        return
    rank, n = ha.rank(), ha.size()
    for algorithm in ("dc-asgd", "softsync", "lc-asgd"):
        finals = {}
        for compression in ("none", "fp16"):
            model = model_for(11)
            opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                          named_parameters=model.named_parameters(), algorithm=algorithm,
                                          compression=compression, **({"lam": 0.0} if algorithm != "softsync" else {}))
            check(opt.strategy.transport.spec.wire == ("fp16" if compression == "fp16" else "fp32"),
                  f"{algorithm}: wire {opt.strategy.transport.spec.wire}")
            opt.begin()  # collective: before the turns, where one worker steps while the others wait
            for step in range(3):  # one worker at a time: the same order of pushes in both runs
                for turn in range(n):
                    if turn == rank:
                        x, y = batch(rank * 100 + step)
                        opt.zero_grad()
                        loss = F.cross_entropy(model(x), y)
                        loss.backward()
                        opt.step(loss=loss.detach())
                    ha.worker_comm().Barrier()
            opt.load_global_model()
            finals[compression] = flat(model).clone()
            opt.close()
        diff = float((finals["fp16"] - finals["none"]).abs().max())
        check(0 < diff < 5e-3, f"{algorithm}: fp16 run differs from fp32 by {diff:.2e}")


def fp16_overflow_skips_the_whole_push():
    """compression=fp16: a gradient element finite in fp32 but beyond fp16's range (1e5, in the last
    shard's part) skips the worker's whole push, as a non-finite one: no shard applies any of it."""
    if not ha.num_servers():
        return
    for algorithm in ("dc-asgd", "softsync", "lc-asgd"):
        model = model_for(5)
        opt = build(algorithm, model, compression="fp16")
        opt.load_global_model()
        before = flat(model).clone()
        if ha.rank() == 0:
            x, y = batch(7)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            list(model.parameters())[-1].grad[0] = 1e5
            opt.step(loss=loss.detach())
            check(opt.strategy.skipped_nonfinite == 1, f"{algorithm}: {opt.strategy.skipped_nonfinite} pushes skipped")
        ha.worker_comm().Barrier()
        opt.load_global_model()
        moved = float((flat(model) - before).abs().max())
        check(moved == 0.0, f"{algorithm}: a push that overflows fp16 moved the global weights by {moved:.2e}")
        opt.close()


def sparse_embeddings():
    """nn.Embedding(sparse=True): ssgd as Horovod (sparse allreduce; or sparse_as_dense), asgd with
    SGD (values) and with SparseAdam (the user's optimizer on the sparse gradient)."""
    rank, n, lr = ha.rank(), ha.size(), 0.5
    cases = [("ssgd", False), ("ssgd", True)] + ([("asgd", False), ("asgd", True)] if ha.num_servers() else [])
    for algorithm, dense in cases:
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        w0 = emb.weight.detach().clone()
        opt = ha.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=lr),
                                      named_parameters=emb.named_parameters(), algorithm=algorithm,
                                      sparse_as_dense=dense)
        emb(torch.tensor([rank, rank + 1])).sum().backward()
        opt.step()
        opt.load_global_model()
        grad = torch.zeros(10, 3)
        for r in range(n):
            grad[r] += 1
            grad[r + 1] += 1
        want = w0 - lr * grad / n  # ssgd averages; asgd adds each push at lr / workers
        check(torch.allclose(emb.weight.detach(), want, atol=1e-6), f"{algorithm} sparse_as_dense={dense}: weights off")
        opt.close()
    # a sparse-only optimizer gets a sparse gradient, sparse_as_dense or not (Horovod densifies for
    # the allreduce only)
    for algorithm, dense in [("ssgd", True)] + ([("asgd", False), ("asgd", True)] if ha.num_servers() else []):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        w0 = emb.weight.detach().clone()
        opt = ha.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1), algorithm=algorithm,
                                      named_parameters=emb.named_parameters(), sparse_as_dense=dense)
        for _ in range(2):
            opt.zero_grad()
            emb(torch.tensor([0, 1])).pow(2).sum().backward()
            opt.step()
        opt.load_global_model()
        moved = (emb.weight.detach() - w0).abs().sum(dim=1) > 0
        what = f"{algorithm}/SparseAdam sparse_as_dense={dense}"
        check(moved[:2].all() and not moved[2:].any(), f"{what}: moved rows {moved.tolist()}")
        everyone_equal(emb.weight.detach().reshape(-1), what)
        opt.close()
    for algorithm in algorithms():  # every other algorithm: sparse gradients train, untouched rows stay
        if algorithm in ("ssgd", "asgd"):
            continue
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        w0 = emb.weight.detach().clone()
        opt = ha.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=lr), algorithm=algorithm,
                                      named_parameters=emb.named_parameters(), **OPTIONS.get(algorithm, {}))
        for _ in range(4):  # (easgd's centre has moved by its 4th step for any tau up to 4)
            opt.zero_grad()
            emb(torch.tensor([rank, rank + 1])).sum().backward()
            opt.step(loss=1.0)
        opt.load_global_model()
        moved = (emb.weight.detach() - w0).abs().sum(dim=1) > 1e-5  # (gossip's exact mean rounds in the last bit)
        check(moved[:n + 1].all() and not moved[n + 1:].any(), f"{algorithm} sparse: moved rows {moved.tolist()}")
        everyone_equal(emb.weight.detach().reshape(-1), f"{algorithm} sparse")
        opt.close()


def names_and_requires_grad():
    """named_parameters=None (Horovod's names), _parameter_names, and a layer frozen mid-training."""
    for algorithm in algorithms():
        model = model_for(9)
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), algorithm=algorithm,
                                      **OPTIONS.get(algorithm, {}))
        names = opt._parameter_names
        check(sorted(names.values()) == [f"allreduce.noname.{i}" for i in range(4)], f"{algorithm}: {names}")
        check(set(names) == set(model.parameters()), f"{algorithm}: _parameter_names keys")
        train(opt, model, 2, seed=ha.rank())
        model[0].weight.requires_grad_(False)
        opt.load_global_model()
        frozen = model[0].weight.detach().clone()
        train(opt, model, 2, seed=ha.rank() + 50)
        opt.load_global_model()
        everyone_equal(flat(model), f"{algorithm}: weights after freezing a layer")
        # (ssgd reduces a zero gradient for it, as Horovod does; easgd's elastic moves pull every
        # layer of a worker towards the centre, trained or not)
        if algorithm not in ("ssgd", "easgd"):
            check(torch.equal(model[0].weight.detach(), frozen), f"{algorithm}: a frozen layer moved")
        opt.close()


def lr_annealed_to_zero():
    """CosineAnnealingLR to 0 under the server-side rules: no server error; at lr 0 nothing moves."""
    if not ha.num_servers():
        return
    for algorithm in ("dc-asgd", "softsync", "lc-asgd", "od-sgd"):
        model = model_for(4)
        opt = build(algorithm, model)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)
        for step in range(2):
            train(opt, model, 1, seed=ha.rank() + step)
            sched.step()
        check(opt.param_groups[0]["lr"] == 0.0, f"{algorithm}: lr {opt.param_groups[0]['lr']}")
        opt.load_global_model()
        before = flat(model).clone()
        train(opt, model, 2, seed=ha.rank() + 9)
        opt.load_global_model()
        check(torch.allclose(flat(model), before, atol=1e-7), f"{algorithm}: weights moved at lr 0")
        opt.close()


def schedulers_see_the_step():
    """A torch LR scheduler built on the wrapped optimizer or on the DistributedOptimizer, stepped after
    each opt.step(), never warns that it was stepped first, under every algorithm (where the rule runs
    on the servers the wrapped optimizer's own step() is never called)."""
    for algorithm in algorithms():
        for on in ("opt.optimizer", "opt"):
            model = model_for(5)
            opt = build(algorithm, model)
            sched = torch.optim.lr_scheduler.StepLR(opt.optimizer if on == "opt.optimizer" else opt, step_size=1,
                                                    gamma=0.5)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for step in range(3):
                    train(opt, model, 1, seed=ha.rank() * 10 + step)
                    sched.step()
            said = [str(w.message)[:80] for w in caught if "lr_scheduler.step()" in str(w.message)]
            check(not said, f"{algorithm}, scheduler on {on}: {said}")
            check(abs(opt.param_groups[0]["lr"] - 0.05 * 0.5 ** 3) < 1e-12, f"{algorithm}: lr {opt.param_groups[0]['lr']}")
            opt.close()


CHECKS = {f.__name__: f for f in (broadcast, rank0_load, clipping_and_accumulation, step_after_synchronize_warns,
                                  options, fp16_through_the_windows, fp16_overflow_skips_the_whole_push,
                                  sparse_embeddings, names_and_requires_grad, lr_annealed_to_zero,
                                  schedulers_see_the_step)}

if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "DROPIN CHECKS OK")
