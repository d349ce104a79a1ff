"""One randomized stress run of an asynchronous algorithm's invariant, run by tests/test_stress.py:
``SERVERS=S python stress_job.py ALGO SEED MAX_SLEEP_MS PUSHES``.

Every worker pushes integer gradients with lr=1 through the real strategy
(``hvd_async.DistributedOptimizer``), sleeping a random while before each step (one worker slower
than the rest, and now and then a long pause) and calling ``synchronize()`` at random points, with
the algorithm's own options drawn from SEED (the same on every rank). Worker 0 prints the options
(``STRESS CASE ...``) and what it checked (``STRESS CHECKED ...``); the harness prints
``STRESS JOB OK ALGO`` at the end and aborts the whole job when a check fails.

What is checked, per algorithm:

- asgd, dbs-asgd, dc-asgd (lam=0, no push clip), lc-asgd (lam=0, no loss term, no push clip),
  softsync (n=workers, rate not scaled by staleness), all with push_rate="full": the final global weights are exactly the initial ones minus the sum of all
  pushes (dbs-asgd: each gradient weighted by its batch share, a multiple of 1/32); the servers
  counted every push and the staleness of each; dbs-asgd's shared cursor moved by every draw.
- od-sgd (window or allreduce exchange): the global weights are exactly the initial ones minus the
  sum of every step's mean gradient (the gradients are multiples of the worker count, so each mean
  is an integer); the servers counted every push and one update per step.
- easgd: the centre's change is the sum of all elastic moves, to within fp32 rounding of each
  ``Accumulate`` (no move lost); the servers counted every move.
- gossip push-sum: ``sum x`` is the initial one plus every local change folded in, to within fp32
  rounding of each push, and ``sum s`` equals the worker count. Pull gossip has no conservation
  law (the peer is not changed): only that it finishes, mixes as often as scheduled and that
  ``synchronize()`` leaves every worker the same finite model.
"""
import json
import os
import sys
import time

import numpy as np
import torch

import hvd_async as ha
from harness import check, main, say
from ps_checks import NUMEL, integer_grad, integer_init

EXACT = {"asgd": {"push_rate": "full"}, "dbs-asgd": {"push_rate": "full"},
         "dc-asgd": {"lam": 0.0, "push_rate": "full", "push_clip": 0.0},
         "lc-asgd": {"lam": 0.0, "loss_term": False, "push_rate": "full", "push_clip": 0.0},
         "softsync": {"staleness_lr": False, "push_rate": "full"}}  # the options under which each push is simply added
NOMINAL_BATCH = 32  # dbs-asgd: a power of two, so every batch share is exact in fp32
ROUNDING = 2.0 ** -23  # a generous bound on one fp32 addition's relative error (2**-24)


class Case:
    """The run's random choices: the algorithm's options (shared by all ranks), this worker's delays."""

    def __init__(self, algo: str, seed: int, max_sleep_ms: float, pushes: int):
        self.algo, self.max_sleep_ms = algo, max_sleep_ms
        shared = np.random.default_rng(seed)
        self.options = self._options(algo, shared, ha.size(), ha.num_servers())
        self.straggler, self.slow = int(shared.integers(ha.size())), float(shared.uniform(1.5, 4.0))
        equal = algo == "od-sgd" or self.options.get("synchronous", False)
        low = pushes if equal else max(1, pushes // 2)
        counts = shared.integers(low, pushes + 1, size=ha.size())
        self.steps = int(counts[ha.rank()])
        fractions = np.sort(shared.uniform(0.1, 0.9, size=int(shared.integers(0, 3))))
        self.sync_at = [int(f * self.steps) for f in fractions]  # every worker syncs as often
        self.syncs = len(fractions)
        self.rng = np.random.default_rng((seed, ha.world_rank()))

    @staticmethod
    def _options(algo, rng, workers, servers):
        pick = lambda *values: values[int(rng.integers(len(values)))]  # noqa: E731
        options = dict(EXACT.get(algo, {}))
        if algo in ("asgd", "dbs-asgd"):
            options["pull_every"] = pick(1, 1, 2, 3)
        if algo == "dbs-asgd":
            options.update(batch_size=NOMINAL_BATCH, every=pick(1, 3, 10))
        if algo in ("dc-asgd", "lc-asgd"):
            options["adaptive"] = pick(False, True)
        if algo == "lc-asgd":
            options["predictor"] = pick("linear", "mlp")
        if algo == "softsync":
            options["n"] = workers
        if algo == "od-sgd":
            options.update(exchange="window" if servers else "allreduce", local_lr=pick(0.0, 0.5, 1.0))
        if os.environ.get("INBOX_SLOTS") and algo in ("dc-asgd", "lc-asgd", "softsync", "od-sgd"):
            options["inbox_slots"] = int(os.environ["INBOX_SLOTS"])  # a pool of slots (test_inbox_slots.py)
        if algo == "easgd":
            options.update(tau=pick(1, 2, 3), alpha=pick(None, 0.25, 0.5), synchronous=pick(False, False, True))
        if algo == "gossip":
            options.update(variant=pick("push", "push", "pull"), topology=pick("random", "ring", "exponential"),
                           every=pick(1, 1, 2), seed=int(rng.integers(1000)))
        return options

    def pause(self) -> None:
        """A random delay before an operation: none half the time, rarely a long one."""
        u = self.rng.random()
        if u < 0.5:
            return
        ms = self.rng.uniform(0, self.max_sleep_ms) * (10 if u > 0.97 else 1)
        time.sleep(ms * (self.slow if ha.rank() == self.straggler else 1.0) / 1000)


def _model():
    """Two parameters (the flat buffer is cut across them) over the 1001 integer start values."""
    init = integer_init()
    params = [torch.nn.Parameter(init[:600].clone().view(20, 30)), torch.nn.Parameter(init[600:].clone())]
    return params, [("layer.weight", params[0]), ("layer.bias", params[1])]


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def _set_grad(params, g: torch.Tensor) -> None:
    params[0].grad = g[:600].view(20, 30).clone()
    params[1].grad = g[600:].clone()


def _drive(case: Case, on_step=None, wrap=None):
    """Build the optimizer (``wrap(opt)`` then records what it needs) and run this worker's steps;
    ``on_step(opt, g)`` returns what the push adds to the global weights (float64; default ``g``),
    summed into the returned total."""
    params, named = _model()
    opt = ha.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=named,
                                  algorithm=case.algo, **case.options)
    if wrap is not None:
        wrap(opt)
    if ha.rank() == 0:
        say(f"STRESS CASE {case.algo} workers={ha.size()} servers={ha.num_servers()} "
            f"options={json.dumps(case.options)} straggler={case.straggler}x{case.slow:.2f} "
            f"syncs={case.syncs}")
    pushed = torch.zeros(NUMEL, dtype=torch.float64)
    for i in range(case.steps):
        case.pause()
        g = integer_grad(ha.rank(), int(case.rng.integers(1000)))
        if case.algo == "od-sgd":
            g = g * ha.size()  # every step's mean over the workers is then an integer
        _set_grad(params, g)
        pushed += on_step(opt, g) if on_step is not None else g.double()
        opt.step(loss=float(case.rng.uniform(0.5, 2.0)))
        for _ in range(case.sync_at.count(i)):
            opt.load_global_model()
    return opt, params, pushed


def _total(x: torch.Tensor) -> np.ndarray:
    return ha.worker_comm().allreduce(x.double().numpy())


def _report(algo: str, checked: int, what: str, transport=None) -> None:
    """Worker 0 says what it checked (and, on a window transport, whether its inbox was a pool and
    how many pushes waited for a slot, summed over the workers: collective)."""
    if transport is not None and hasattr(transport, "slot_waits"):
        waits = ha.worker_comm().allreduce(transport.slot_waits)
        if ha.rank() == 0:
            say(f"STRESS SLOTS pooled={transport.spec.pooled} slots={transport.spec.inbox_slots} waits={waits}")
    if ha.rank() == 0:
        say(f"STRESS CHECKED {algo} pushes={checked} {what}")


def _exact(got: torch.Tensor, expected: np.ndarray, what: str) -> None:
    diff = got.double().numpy() != expected
    bad = np.nonzero(diff)[0]
    check(not diff.any(), f"{what}: {len(bad)} element(s) off, first at {bad[:5].tolist()}: "
                          f"got {got[bad[:5]].tolist()}, expected {expected[bad[:5]].tolist()}")


def _server_counts(t, pushes: int, updates: int, hist) -> None:
    """Every shard counted ``pushes`` pushes and ``updates`` updates, and (``hist`` given) the
    staleness of each push as the workers saw it."""
    t.read_stats()  # hands this worker's staleness counts still held locally to the servers
    t.barrier()
    for k, row in enumerate(t.read_stats()):
        check(row["pushes"] == pushes and row["version"] == updates,
              f"shard {k} counted version={row['version']} pushes={row['pushes']}, expected "
              f"{updates} and {pushes}")
        check(sum(row["staleness_hist"]) == pushes, f"shard {k}: {sum(row['staleness_hist'])} staleness "
                                                    f"counts for {pushes} pushes")
        if hist is not None:
            check(row["staleness_hist"] == hist[k].tolist(),
                  f"shard {k}: staleness counted by the server {row['staleness_hist'][:8]} != seen by the "
                  f"workers {hist[k][:8].tolist()}")


def parameter_server():
    """asgd, dbs-asgd, dc-asgd, lc-asgd, softsync: the global weights lose no push."""
    case = CASE
    cursor, sizes = [0], set()

    def dbs_step(opt, g):  # draws its batch from the shared cursor, weighted by its share as dbs-asgd does
        used = opt.strategy.batch_size
        opt.strategy.transport.fetch_add_counter(used)
        cursor[0] += used
        sizes.add(used)
        return g.double() * (used / NOMINAL_BATCH)

    opt, params, pushed = _drive(case, dbs_step if case.algo == "dbs-asgd" else None)
    opt.load_global_model()
    total, t = _total(pushed), opt.strategy.transport
    _exact(_flat(params), integer_init().double().numpy() - total, f"{case.algo}: global weights lost updates")
    pushes = ha.worker_comm().allreduce(case.steps)
    _server_counts(t, pushes, pushes, ha.worker_comm().allreduce(opt.strategy.hist))
    if case.algo == "dbs-asgd":
        drawn, at = ha.worker_comm().allreduce(cursor[0]), t.fetch_add_counter(0)
        check(at == drawn, f"dbs-asgd: the shared cursor is at {at}, {drawn} samples were drawn")
        sizes = sorted(set().union(*ha.worker_comm().allgather(sizes)))
    _report(case.algo, pushes, "exact" + (f", {len(sizes)} batch sizes from {sizes[0]} to {sizes[-1]}"
                                          if case.algo == "dbs-asgd" else ""), t)
    opt.close()


def one_step_delay():
    """od-sgd: the global weights are the start less every step's mean gradient, exactly."""
    case = CASE
    opt, params, pushed = _drive(case)
    opt.load_global_model()
    expected = integer_init().double().numpy() - _total(pushed) / ha.size()
    _exact(_flat(params), expected, "od-sgd: global weights off the sum of the steps' mean gradients")
    pushes = ha.worker_comm().allreduce(case.steps)
    if case.options["exchange"] == "window":
        _server_counts(opt.strategy.transport, pushes, case.steps, None)
    _report(case.algo, pushes, "exact", opt.strategy.transport)
    opt.close()


class _Tally:
    """Changes added somewhere (fp32 values, summed exactly in fp64), with their absolute size."""

    def __init__(self):
        self.sum = torch.zeros(NUMEL, dtype=torch.float64)
        self.size = torch.zeros(NUMEL, dtype=torch.float64)
        self.count = 0

    def add(self, change: torch.Tensor) -> None:
        change = change.double()
        self.sum += change
        self.size += change.abs()
        self.count += 1

    def totals(self):
        """Collective over the workers: the sums, the sizes and the count of all workers' changes."""
        return _total(self.sum), _total(self.size), ha.worker_comm().allreduce(self.count)


def _within_rounding(got: np.ndarray, expected: np.ndarray, additions: int, scale: np.ndarray, what: str) -> float:
    """``got`` is ``expected`` but for the rounding of ``additions`` fp32 additions of values no larger
    than ``scale`` (per element); returns the largest error."""
    err = np.abs(got - expected)
    bound = ROUNDING * additions * scale
    check((err <= bound).all(), f"{what} off by up to {err.max():.3g} after {additions} fp32 additions "
                                f"(bound {bound[err.argmax()]:.3g} there)")
    return float(err.max())


def elastic():
    """easgd: the centre moved by the sum of every worker's elastic moves (fp32 rounding aside)."""
    case = CASE
    moves = _Tally()

    def wrap(opt):
        transport = opt.strategy.transport
        original = transport.accumulate

        def recording(delta):
            moves.add(delta)
            return original(delta)

        transport.accumulate = recording

    opt, params, _ = _drive(case, wrap=wrap)
    opt.load_global_model()  # the model holds the centre
    total, size, n = moves.totals()
    init = integer_init().double().numpy()
    err = _within_rounding(_flat(params).double().numpy(), init + total, n + 1, np.abs(init) + size,
                           f"easgd: the centre, against the sum of {n} moves,")
    _server_counts(opt.strategy.transport, n, n, None)
    opt.close()
    _report(case.algo, n, f"moves, largest error {err:.2g} (fp32 rounding)")


def gossip():
    """push-sum keeps sum x (plus the local changes folded in) and sum s; pull just finishes."""
    case = CASE
    folds = _Tally()

    def wrap(opt):
        if case.options["variant"] != "push":
            return
        opt.begin()  # the mixer is made there (collective: every worker wraps right after building)
        mixer = opt.strategy.mixer
        original = mixer._fold

        def recording(flat, x, s):
            before = x.double().clone()
            original(flat, x, s)
            folds.add(x.double() - before)  # exact: a difference of two fp32 values in fp64

        mixer._fold = recording

    opt, params, _ = _drive(case, wrap=wrap)
    t, workers = opt.strategy.transport, ha.size()
    mixes = ha.worker_comm().allreduce(opt.strategy.mixes)
    held = ha.worker_comm().allreduce(opt.strategy.held)
    expected_mixes = ha.worker_comm().allreduce(case.steps // case.options["every"]) if workers > 1 else 0
    check(mixes + held == expected_mixes, f"gossip: {mixes} mixes and {held} held, expected {expected_mixes}")
    if case.options["variant"] == "push":
        t.barrier()  # every push has landed (each completes before its sender goes on)
        with t.own() as (x, s):
            mine = (x.double().clone(), float(s[0]))
        everyone = t.allgather_object(mine)
        sum_x, sum_s = sum(x for x, _ in everyone).numpy(), sum(s for _, s in everyone)
        total, size, _ = folds.totals()
        init = integer_init().double().numpy()
        err = _within_rounding(sum_x, workers * init + total, mixes + case.syncs * (workers + 2) + 1,
                               workers * np.abs(init) + size, f"push-sum: sum x, after {mixes} pushes,")
        check(abs(sum_s - workers) < 1e-9, f"push-sum: weights sum to {sum_s!r}, not {workers}")
    opt.load_global_model()
    final = _flat(params)
    everyone = t.allgather_object(final)
    check(bool(torch.isfinite(final).all()), "gossip: non-finite weights after synchronize")
    check(all(torch.equal(everyone[0], w) for w in everyone), "gossip: workers differ after synchronize")
    opt.close()
    if case.options["variant"] == "push":
        _report(case.algo, mixes, f"push-sum mixes, largest error {err:.2g} (fp32 rounding)")
    else:
        _report(case.algo, 0, f"(pull: {mixes} mixes, no conservation law)")


FAMILY = {"asgd": parameter_server, "dbs-asgd": parameter_server, "dc-asgd": parameter_server,
          "lc-asgd": parameter_server, "softsync": parameter_server, "od-sgd": one_step_delay,
          "easgd": elastic, "gossip": gossip}
CASE = None

if __name__ == "__main__":
    algo, seed, max_sleep_ms, pushes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    ha.init(servers=int(os.environ.get("SERVERS", "1")))
    if not ha.is_server():
        CASE = Case(algo, seed, max_sleep_ms, pushes)
    main({algo: FAMILY[algo]}, [algo], "STRESS JOB OK")
