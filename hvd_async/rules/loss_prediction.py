"""Per-worker loss predictors for lc-asgd: a worker's (global version, loss) reports in, its loss at a later version out.

The parameter server of lc-asgd (:class:`hvd_async.rules.lc.LCRule`) keeps one predictor per worker
and asks it for the loss that worker would report at the version where its stale gradient is
applied. Two predictors, named in :data:`PREDICTORS`:

* ``"linear"`` (:class:`LinearPredictor`): a weighted least-squares line through
  ``log(L - floor)`` against the version, recent points weighted more; cheap (``O(window)`` numpy).
* ``"mlp"`` (:class:`MLPPredictor`): a one-hidden-layer tanh network trained online on the
  window's own (past points -> later point) pairs; the linear prediction until it has trained.

Common behaviour (:class:`LossPredictor`):

* Memory and cost are bounded: only the newest ``window`` accepted points are kept.
* A report is ignored and counted in ``ignored`` when its loss is not finite, when it is not above
  ``floor`` (``log(L - floor)`` is undefined there), or when its version is older than the newest
  kept point (a worker's pushes arrive in order; an older one is a stray).
* ``predict(version)`` is ``None`` until ``min_history`` points are kept. The requested version is
  clamped to ``reach = min(max_horizon, v_newest - v_oldest)`` versions either side of the newest
  point (never further ahead than the kept history reaches back: a slope fitted on a short,
  noisy history is not extrapolated far), and the predicted ``L - floor`` to
  ``[min / max_ratio, max * max_ratio]`` of the window's ``L - floor``, so a far or steep
  extrapolation cannot explode.

Example::

    >>> p = make_predictor("linear", decay=1.0)
    >>> for v in range(6):
    ...     p.observe(v, 2.0 ** -v)        # halves every version
    >>> round(p.predict(8), 6)             # log-linear: exactly 2 ** -8
    0.003906
"""
import abc
import math
import numbers
from collections import deque
from typing import Any, Dict, Optional, Type

import numpy as np
import torch

from ..checks import is_finite_number


def _integer(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _real(name: str, value, low: float, high: float = math.inf, *, low_open: bool = False,
          high_open: bool = False) -> float:
    ok = (is_finite_number(value)
          and (value > low if low_open else value >= low) and (value < high if high_open else value <= high))
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return float(value)


def _version(value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"version must be an integer (the global model version), got {value!r}")
    return int(value)


class LossPredictor(abc.ABC):
    """One worker's loss history and a prediction of its loss at a later global version.

    Args:
        window: points kept (the newest ``window``; memory and cost per call are ``O(window)``).
        floor: the loss's lower bound ``L*`` (0 for cross-entropy); the predictors work on
            ``log(L - floor)``.
        min_history: points needed before :meth:`predict` answers (``>= 2``, ``<= window``).
        max_horizon: the furthest, in versions, a prediction reaches past (or before) the newest
            point; a request further away is answered at that distance (which is also at most
            the kept points' version span).
        max_ratio: the predicted ``L - floor`` stays within ``[min / max_ratio, max * max_ratio]``
            of the window's values (``> 1``).
    """

    name = "predictor"

    def __init__(self, *, window: int = 32, floor: float = 0.0, min_history: int = 4,
                 max_horizon: int = 64, max_ratio: float = 10.0):
        self.window = _integer("window", window, 2)
        self.floor = _real("floor", floor, -math.inf)
        self.min_history = _integer("min_history", min_history, 2)
        if self.min_history > self.window:
            raise ValueError(f"min_history must be <= window ({self.window}), got {min_history!r}")
        self.max_horizon = _integer("max_horizon", max_horizon, 1)
        self.max_ratio = _real("max_ratio", max_ratio, 1.0, low_open=True)
        self._versions: deque = deque(maxlen=self.window)
        self._logs: deque = deque(maxlen=self.window)  # log(L - floor)
        self.ignored = 0

    def __len__(self) -> int:
        return len(self._versions)

    @property
    def ready(self) -> bool:
        """Whether :meth:`predict` answers (``min_history`` points kept)."""
        return len(self._versions) >= self.min_history

    def observe(self, version: int, loss: float) -> None:
        """Record the loss a worker reported for weights of global version ``version``."""
        version = _version(version)
        loss = float(loss)
        if (not math.isfinite(loss) or loss <= self.floor
                or (self._versions and version < self._versions[-1])):
            self.ignored += 1
            return
        self._versions.append(version)
        self._logs.append(math.log(loss - self.floor))
        self._observed(version, loss)

    def predict(self, version: int) -> Optional[float]:
        """The predicted loss at global version ``version``; ``None`` until :attr:`ready`."""
        version = _version(version)
        if not self.ready:
            return None
        last = self._versions[-1]
        reach = min(self.max_horizon, last - self._versions[0])
        target = min(max(version, last - reach), last + reach)
        bound = math.log(self.max_ratio)
        log_gap = min(max(self._predict_log(target), min(self._logs) - bound), max(self._logs) + bound)
        return self.floor + math.exp(log_gap)

    def _observed(self, version: int, loss: float) -> None:
        """Hook: a point was appended (default: nothing)."""

    def state_dict(self) -> Dict[str, Any]:
        """The kept points and counters (plain values: a checkpoint holds them)."""
        return {"versions": list(self._versions), "logs": list(self._logs), "ignored": self.ignored}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._versions.clear()
        self._versions.extend(int(v) for v in state["versions"])
        self._logs.clear()
        self._logs.extend(float(y) for y in state["logs"])
        self.ignored = int(state["ignored"])
        self._observed_reset()

    def _observed_reset(self) -> None:
        """Hook: the points were replaced (drop caches)."""

    @abc.abstractmethod
    def _predict_log(self, target: int) -> float:
        """``log(L - floor)`` predicted at ``target`` (already within ``max_horizon``)."""


class LinearPredictor(LossPredictor):
    """Weighted least squares of ``y = log(L - floor)`` on the version, extrapolated.

    The ``i``-th newest point (``i = 0`` the newest) has weight ``decay ** i``; the line
    ``y = a + b (v - v_last)`` minimises ``sum_i w_i (y_i - a - b (v_i - v_last)) ** 2``:
    ``b = sum w (v - vbar)(y - ybar) / sum w (v - vbar) ** 2`` and ``a = ybar - b (vbar - v_last)``
    with ``vbar``, ``ybar`` the weighted means (``b = 0`` when all versions are equal). A straight
    line in ``log(L - floor)`` is an exponential decay towards ``floor``.

    Args:
        decay: weight factor per point of age, in ``(0, 1]`` (1: unweighted). The fit effectively
            looks back ``1 / (1 - decay)`` points (about 7 at the default 0.85): lower follows a bending
            curve faster, higher averages the mini-batch noise better.
        **common: :class:`LossPredictor`'s options.
    """

    name = "linear"

    def __init__(self, *, decay: float = 0.85, **common):
        super().__init__(**common)
        self.decay = _real("decay", decay, 0.0, 1.0, low_open=True)
        self._powers = self.decay ** np.arange(self.window - 1, -1, -1, dtype=np.float64)
        self._fit = None

    def _observed(self, version, loss):
        self._fit = None

    def _observed_reset(self):
        self._fit = None

    def coefficients(self):
        """``(a, b)``: the fitted log-gap at the newest version and its slope per version."""
        if self._fit is None:
            n = len(self._versions)
            last = self._versions[-1]
            v = np.fromiter(self._versions, dtype=np.float64, count=n) - last
            y = np.fromiter(self._logs, dtype=np.float64, count=n)
            w = self._powers[self.window - n:]
            total = w.sum()
            v_mean, y_mean = (w @ v) / total, (w @ y) / total
            dv = v - v_mean
            sxx = w @ (dv * dv)
            slope = float((w @ (dv * (y - y_mean))) / sxx) if sxx > 0 else 0.0
            self._fit = (float(y_mean - slope * v_mean), slope)
        return self._fit

    def _predict_log(self, target):
        a, b = self.coefficients()
        return a + b * (target - self._versions[-1])


class MLPPredictor(LossPredictor):
    """A small network, trained online, maps the recent history and a horizon to the log-change.

    Inputs, for an end point ``e`` and its ``context - 1`` predecessors ``i`` (in the window):
    ``y_i - y_e`` (``y = log(L - floor)``), ``(v_i - v_e) / s``, and the horizon ``h / s``, where
    ``s = max(1, v_e - v_(e - context + 1))`` is the context's version span (scale-free in the spacing of a
    worker's reports). Output: ``y_future - y_e``, i.e. ``log((L_future - floor) / (L_e - floor))``.
    Network: ``2 (context - 1) + 1`` inputs, one hidden layer of ``hidden`` tanh units, a linear
    output initialised to zero (first predictions: no change).

    Training: the pairs are every (end ``e``, later point ``t``) in the window with
    ``0 < v_t - v_e <= max_horizon`` (at most ``window ** 2 / 2``). After each accepted report,
    ``steps`` Adam steps (rate ``lr``), each on the mean squared error over ``batch`` of those pairs
    drawn at random without replacement (all of them if fewer). Until ``warmup_steps`` steps have
    been taken, and for a horizon ``<= 0``, it answers with the linear prediction
    (:class:`LinearPredictor` with ``decay``). Deterministic given ``seed`` (private generators;
    the global torch and numpy seeds are untouched).

    Args:
        context: points per input (``>= 2``, ``< window``).
        hidden: hidden units.
        lr: Adam's learning rate.
        steps: Adam steps per accepted report.
        warmup_steps: steps before the network's predictions are used.
        batch: training pairs per step.
        seed: seeds the initial weights and the batch draws.
        decay: the linear fallback's ``decay``.
        **common: :class:`LossPredictor`'s options.

    Tuning: it learns the shape of the curve from the curve's own past, so it needs a few hundred
    reports per worker to beat the linear fit reliably; raise ``steps`` if it trails it for long.
    Its ops take microseconds; on a host whose cores are busy (a server rank beside worker ranks)
    torch's intra-op thread pool can turn some of them into milliseconds (its threads wait for cores
    the other ranks hold), so run such a server single-threaded. A larger ``batch`` costs more per step.
    """

    name = "mlp"

    def __init__(self, *, context: int = 8, hidden: int = 16, lr: float = 0.01, steps: int = 1,
                 warmup_steps: int = 64, batch: int = 32, seed: int = 0, decay: float = 0.85,
                 **common):
        super().__init__(**common)
        self.context = _integer("context", context, 2)
        if self.context >= self.window:
            raise ValueError(f"context must be < window ({self.window}), got {context!r}")
        self.hidden = _integer("hidden", hidden, 1)
        self.lr = _real("lr", lr, 0.0, low_open=True)
        self.steps = _integer("steps", steps, 1)
        self.warmup_steps = _integer("warmup_steps", warmup_steps, 0)
        self.batch = _integer("batch", batch, 1)
        seed = _integer("seed", seed, 0)
        self._rng = np.random.default_rng(seed)
        self._linear = LinearPredictor(decay=decay, **common)
        inputs = 2 * (self.context - 1) + 1
        generator = torch.Generator().manual_seed(seed)
        self._w1 = (torch.randn(inputs, self.hidden, generator=generator) / math.sqrt(inputs)).requires_grad_()
        self._b1 = torch.zeros(self.hidden, requires_grad=True)
        self._w2 = torch.zeros(self.hidden, 1, requires_grad=True)
        self._b2 = torch.zeros(1, requires_grad=True)
        self._optimizer = torch.optim.Adam([self._w1, self._b1, self._w2, self._b2], lr=self.lr)
        self.updates = 0  # Adam steps taken
        self.pairs_seen = 0  # training pairs summed over steps

    def state_dict(self) -> Dict[str, Any]:
        state = super().state_dict()
        state.update(net=[t.detach().clone() for t in (self._w1, self._b1, self._w2, self._b2)],
                     adam=self._optimizer.state_dict(), rng=self._rng.bit_generator.state,
                     updates=self.updates, pairs_seen=self.pairs_seen, linear=self._linear.state_dict())
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            for param, saved in zip((self._w1, self._b1, self._w2, self._b2), state["net"]):
                param.copy_(saved)
        self._optimizer.load_state_dict(state["adam"])
        self._rng.bit_generator.state = state["rng"]
        self.updates, self.pairs_seen = int(state["updates"]), int(state["pairs_seen"])
        self._linear.load_state_dict(state["linear"])

    def _net(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self._w1 + self._b1) @ self._w2 + self._b2

    def _features(self, v: np.ndarray, y: np.ndarray, ends: np.ndarray, horizons: np.ndarray) -> np.ndarray:
        ctx = ends[:, None] + np.arange(-(self.context - 1), 0)
        span = np.maximum(v[ends] - v[ends - (self.context - 1)], 1.0)[:, None]
        return np.concatenate([y[ctx] - y[ends][:, None], (v[ctx] - v[ends][:, None]) / span,
                               horizons[:, None] / span], axis=1)

    def _arrays(self):
        n = len(self._versions)
        return (np.fromiter(self._versions, dtype=np.float64, count=n),
                np.fromiter(self._logs, dtype=np.float64, count=n))

    def _observed(self, version, loss):
        self._linear.observe(version, loss)
        n = len(self._versions)
        if n <= self.context:
            return
        v, y = self._arrays()
        ends, later = np.triu_indices(n, k=1)
        keep = ends >= self.context - 1
        ends, later = ends[keep], later[keep]
        horizons = v[later] - v[ends]
        keep = (horizons > 0) & (horizons <= self.max_horizon)
        if not keep.any():
            return
        ends, later, horizons = ends[keep], later[keep], horizons[keep]
        x_all = torch.from_numpy(self._features(v, y, ends, horizons)).float()
        target_all = torch.from_numpy(y[later] - y[ends]).float()[:, None]
        for _ in range(self.steps):
            x, target = x_all, target_all
            if len(ends) > self.batch:
                rows = torch.from_numpy(self._rng.choice(len(ends), self.batch, replace=False))
                x, target = x_all[rows], target_all[rows]
            self._optimizer.zero_grad()
            loss_value = torch.mean((self._net(x) - target) ** 2)
            loss_value.backward()
            self._optimizer.step()
            self.pairs_seen += len(target)
        self.updates += self.steps

    def _predict_log(self, target):
        horizon = target - self._versions[-1]
        if self.updates < self.warmup_steps or horizon <= 0 or len(self._versions) < self.context:
            return self._linear._predict_log(target)
        v, y = self._arrays()
        end = np.array([len(v) - 1])
        x = torch.from_numpy(self._features(v, y, end, np.array([float(horizon)]))).float()
        with torch.no_grad():
            return float(y[-1] + self._net(x).item())


PREDICTORS: Dict[str, Type[LossPredictor]] = {
    LinearPredictor.name: LinearPredictor,
    MLPPredictor.name: MLPPredictor,
}


def make_predictor(name: str, **options) -> LossPredictor:
    """A fresh predictor named in :data:`PREDICTORS`, with its options checked."""
    if name not in PREDICTORS:
        raise ValueError(f"unknown loss predictor {name!r}; choose one of: {', '.join(PREDICTORS)}")
    try:
        return PREDICTORS[name](**options)
    except TypeError as error:  # an option this predictor does not take
        raise ValueError(f"bad option for loss predictor {name!r}: {error}") from None
