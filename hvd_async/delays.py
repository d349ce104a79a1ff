"""Each worker's device time per step, drawn around ``--compute-ms``: the one model that ``hvd-async
train`` sleeps (its emulated accelerator) and ``hvd-async simulate`` moves its virtual clock by.

Every distribution (``--delay-dist``) has mean ``compute_ms`` (before the worker's straggler
factor); ``shape`` (``--delay-shape``) sets its spread:

- ``constant``: always the mean (no shape);
- ``uniform``: uniform on ``mean * [1 - shape, 1 + shape]``, shape in [0, 1] (default 0.5);
- ``exponential``: exponential with that mean (no shape);
- ``lognormal``: ``exp(N(mu, shape^2))`` with ``mu = ln(mean) - shape^2 / 2``, shape (sigma) > 0
  (default 1.0);
- ``pareto``: Pareto with scale ``mean * (shape - 1) / shape`` and tail index shape (alpha) > 1
  (default 3.0; the closer to 1, the heavier the tail).

Worker ``w`` of a run with ``--seed S`` draws from
``numpy.random.Generator(PCG64(SeedSequence(S, spawn_key=(w,))))``: the same seed gives the same
draws, in the job and in the simulator, whatever the other workers do.

Example::

    >>> model = DelayModel("uniform", mean_ms=10.0, shape=None, seed=0, worker=3, factor=2.0)
    >>> 0.01 <= model.draw() <= 0.03   # seconds: (10 ms +- 50%) x 2
    True
"""
from typing import Optional

import numpy as np

DISTRIBUTIONS = ("constant", "uniform", "exponential", "lognormal", "pareto")
DEFAULT_SHAPE = {"uniform": 0.5, "lognormal": 1.0, "pareto": 3.0}


def check_shape(dist: str, shape: Optional[float]) -> Optional[float]:
    """The shape to use for ``dist`` (its default when None); ValueError naming what is accepted."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"--delay-dist {dist!r}: choose one of {', '.join(DISTRIBUTIONS)}")
    if dist not in DEFAULT_SHAPE:
        if shape is not None:
            raise ValueError(f"--delay-shape {shape}: the {dist} distribution takes no shape; "
                             f"shapes are for {', '.join(DEFAULT_SHAPE)}")
        return None
    shape = DEFAULT_SHAPE[dist] if shape is None else float(shape)
    if dist == "uniform" and not 0 <= shape <= 1:
        raise ValueError(f"--delay-shape {shape}: uniform's half-width (a fraction of the mean) must be in [0, 1]")
    if dist == "lognormal" and not 0 < shape < 10:
        raise ValueError(f"--delay-shape {shape}: lognormal's sigma must be in (0, 10)")
    if dist == "pareto" and not 1 < shape < float("inf"):
        raise ValueError(f"--delay-shape {shape}: pareto's alpha must be > 1 (the mean is infinite at 1)")
    return shape


class DelayModel:
    """Device time per step of one worker, in seconds: ``draw(scale)`` for a batch ``scale`` times the
    nominal one (dbs-asgd's batches vary), times the worker's slow-down ``factor``."""

    def __init__(self, dist: str, *, mean_ms: float, shape: Optional[float], seed: int, worker: int,
                 factor: float = 1.0):
        if not mean_ms > 0:
            raise ValueError(f"--compute-ms must be > 0 to draw device times around it, got {mean_ms}")
        self.dist, self.shape = dist, check_shape(dist, shape)
        self.mean = mean_ms / 1000.0
        self.factor = float(factor)
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(worker,))))

    def _base(self) -> float:
        m, s, rng = self.mean, self.shape, self.rng
        if self.dist == "constant":
            return m
        if self.dist == "exponential":
            return float(rng.exponential(m))
        assert s is not None  # check_shape gives the other distributions a shape
        if self.dist == "uniform":
            return float(rng.uniform(m * (1 - s), m * (1 + s)))
        if self.dist == "lognormal":
            return float(rng.lognormal(np.log(m) - s * s / 2, s))
        return float(m * (s - 1) / s * (1.0 + rng.pareto(s)))  # numpy's pareto is Lomax: shift by 1

    def draw(self, scale: float = 1.0) -> float:
        return self._base() * self.factor * scale

    @classmethod
    def of_job(cls, job, worker: int, factor: float) -> "DelayModel":
        """Worker ``worker``'s model in the job ``job`` (a :class:`~hvd_async.job.jobspec.JobOptions`:
        ``--delay-dist``, ``--compute-ms``, ``--delay-shape``, ``--seed``), stretched by ``factor``."""
        return cls(job.delay_dist, mean_ms=job.compute_ms, shape=job.delay_shape, seed=job.seed, worker=worker,
                   factor=factor)
