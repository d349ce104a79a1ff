"""A worker's own speed, for the algorithms whose batch sizes follow it (dbs-asgd, lb-sgd): samples
per second of its compute, smoothed by a moving average. The first interval after a start, a restore
or a ``load_global_model`` is not measured (it holds waits that are not compute)."""


class SpeedMeter:
    """``observe(samples, seconds)`` after each measured interval; ``speed`` is the smoothed rate (0.0
    until the first measured interval); ``skip_next()`` leaves the next interval out."""

    def __init__(self, smoothing: float):
        self.smoothing = smoothing  # the weight of the past, in [0, 1)
        self.speed = 0.0
        self._skip = True

    def skip_next(self) -> None:
        self._skip = True

    def observe(self, samples: float, seconds: float) -> None:
        if self._skip:
            self._skip = False
            return
        rate = samples / max(seconds, 1e-9)
        s = self.smoothing
        self.speed = rate if self.speed == 0.0 else s * self.speed + (1 - s) * rate
