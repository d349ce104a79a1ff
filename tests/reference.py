"""Float64 replays of update rules written out by hand, shared by the unit and the MPI tests."""
from typing import Callable, List, Optional, Tuple

import torch


def sgd_step(w: torch.Tensor, g: torch.Tensor, buf: Optional[torch.Tensor], *, lr: float,
             momentum: float = 0.0, weight_decay: float = 0.0) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """torch.optim.SGD's step (dampening 0, no Nesterov), returning the new weights and buffer."""
    d = g + weight_decay * w
    if momentum:
        buf = d.clone() if buf is None else momentum * buf + d
        d = buf
    return w - lr * d, buf


def odsgd(init: torch.Tensor, grad: Callable[[int, int, torch.Tensor], torch.Tensor], workers: int,
          steps: int, *, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, local_lr: float,
          local_momentum: float = 0.0) -> Tuple[List[List[torch.Tensor]], torch.Tensor]:
    """One-step delay SGD: ``grad(m, t, w)`` is worker m's gradient at step t evaluated at w.

    Returns ``local[t][m]`` (worker m's weights after its step t, ``w_m(t+1) = w_g(t) - local
    step of g_m(t)``) and ``w_g(steps)`` (the global weights once the last exchange completed)."""
    wg, buf = init.double().clone(), None
    local_bufs = [None] * workers
    w = [wg.clone() for _ in range(workers)]
    previous = None  # mean gradient of step t-1, applied to the global weights at step t
    history = []
    for t in range(steps):
        grads = [grad(m, t, w[m]) for m in range(workers)]
        if previous is not None:
            wg, buf = sgd_step(wg, previous, buf, lr=lr, momentum=momentum, weight_decay=weight_decay)
        previous = sum(grads) / workers
        for m in range(workers):
            w[m], local_bufs[m] = sgd_step(wg, grads[m], local_bufs[m], lr=local_lr, momentum=local_momentum)
        history.append([x.clone() for x in w])
    wg, buf = sgd_step(wg, previous, buf, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return history, wg


def delayed_ssgd(init: torch.Tensor, grad, workers: int, steps: int, *, lr: float) -> torch.Tensor:
    """``w(t+1) = w(t) - lr * mean_m g_m(w(t-1))`` with ``w(-1) = w(0)``: ssgd one step late."""
    before, now = init.double().clone(), init.double().clone()
    for t in range(steps):
        mean = sum(grad(m, t, before) for m in range(workers)) / workers
        before, now = now, now - lr * mean
    return now


class Quadratic(torch.nn.Module):
    """A fake model whose loss for worker m at step t is ``0.5 * sum(c_m * (w - target(m, t))^2)``, so
    its gradient at w is known in closed form: ``c_m * (w - target(m, t))``."""

    def __init__(self, numel: int = 5):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, numel))

    @staticmethod
    def target(m: int, t: int, numel: int) -> torch.Tensor:
        return torch.cos(torch.arange(numel, dtype=torch.float64) * (m + 1) + 0.3 * t)

    @staticmethod
    def scale(m: int) -> float:
        return 0.5 + 0.25 * m

    @classmethod
    def grad(cls, m: int, t: int, w: torch.Tensor) -> torch.Tensor:
        return cls.scale(m) * (w.double() - cls.target(m, t, w.numel()))

    def loss(self, m: int, t: int) -> torch.Tensor:
        diff = self.w - self.target(m, t, self.w.numel()).float()
        return 0.5 * self.scale(m) * (diff * diff).sum()


def table_start(worker: int, numel: int) -> torch.Tensor:
    """Initial weights that differ by worker (worker 0's must win the initial broadcast)."""
    return torch.linspace(-1.0, 1.0, numel, dtype=torch.float64) + worker


def table_grad(worker: int, step: int, numel: int) -> torch.Tensor:
    """A fixed gradient table: worker m's gradient at step t, whatever the weights."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * worker + step), dtype=torch.float64)


def hpsgd(workers: int, steps: int, *, numel: int, lr: float, k: int, rate: float, momentum: float,
          overlap: bool, keep_own: bool = True):
    """hpsgd on the fixed gradient table with local SGD (momentum): per step (replicas, G), then G after
    the final synchronize() (the partial window's change is taken before the pending one merges)."""
    g_model = table_start(0, numel)
    replicas = [g_model.clone() for _ in range(workers)]
    starts = [g_model.clone() for _ in range(workers)]
    bufs = [None] * workers
    pending, trace = None, []
    for t in range(1, steps + 1):
        for m in range(workers):
            g = table_grad(m, t, numel)
            bufs[m] = g.clone() if bufs[m] is None else momentum * bufs[m] + g
            replicas[m] = replicas[m] - lr * bufs[m]
        if t % k == 0:
            changes = [r - s for r, s in zip(replicas, starts)]
            average = sum(changes) / workers
            if overlap:
                if pending is not None:
                    g_model = g_model + rate * pending
                pending = average
                replicas = [g_model + d if keep_own else g_model.clone() for d in changes]
            else:
                g_model = g_model + rate * average
                replicas = [g_model.clone() for _ in range(workers)]
            starts = [r.clone() for r in replicas]
        trace.append(([r.clone() for r in replicas], g_model.clone()))
    partial = sum(r - s for r, s in zip(replicas, starts)) / workers if steps % k else None
    if pending is not None:
        g_model = g_model + rate * pending
    if partial is not None:
        g_model = g_model + rate * partial
    return trace, g_model


def cross_entropy_steps(model, opt, indices: Callable[[int], List[int]], x: torch.Tensor, y: torch.Tensor,
                        steps: int) -> List[List[torch.Tensor]]:
    """``steps`` steps of ``opt`` on the cross-entropy of ``model`` over the samples ``indices(step)`` of
    ``x, y``; returns each step's gradients as the optimizer saw them (after an exchange, the averaged)."""
    import torch.nn.functional as F

    grads = []
    for step in range(steps):
        idx = indices(step)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads


def global_batch_steps(model, sequence, x: torch.Tensor, y: torch.Tensor, steps: int, global_batch: int, *,
                       lr: float) -> Tuple[List[torch.Tensor], List[List[torch.Tensor]]]:
    """torch.optim.SGD in one process on each step's whole global batch (positions ``k*B .. (k+1)*B-1`` of
    ``sequence``, a :class:`hvd_async.sampling.SharedCursorBatches`): the weights and gradients that
    synchronous SGD over any split of those batches must give (lb-sgd)."""
    grads = cross_entropy_steps(model, torch.optim.SGD(model.parameters(), lr=lr),
                                lambda step: sequence.indices(step * global_batch, global_batch), x, y, steps)
    return [p.detach().clone() for p in model.parameters()], grads


def paced_draws(opt, now: List[float], speed: Callable[[int], float], num_samples: int, seed: int):
    """``indices(step)`` for :func:`cross_entropy_steps` under an algorithm that sizes the batches
    (lb-sgd): ``opt.strategy.batch_size`` samples drawn through the strategy's cursor, after the worker's
    clock ``now[0]`` moved by that batch over ``speed(step)`` samples/s (its compute, injected instead
    of timed). Returns ``(indices, sizes)``; ``sizes`` gets every worker's sizes each step drew with."""
    from hvd_async.sampling import SharedCursorBatches

    batches, sizes = SharedCursorBatches(num_samples, seed=seed, fetch_add=opt.strategy.batch_cursor()), []

    def indices(step: int) -> List[int]:
        sizes.append(opt.strategy.batch_sizes)
        now[0] += opt.strategy.batch_size / speed(step)
        return batches.draw(opt.strategy.batch_size)[1]

    return indices, sizes
