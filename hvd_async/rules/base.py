"""A rule is the update's pure math: tensors in, tensors out; no MPI, no Horovod, no ranks.

Modelled on optax's (init, update) pair: ``init(weights)`` builds the rule's own state (e.g. the
per-worker backups of DC-ASGD), ``apply_(weights, grad, state, ...)`` changes ``weights`` in place.
Strategies call rules; the same rule object runs on a server rank, in a worker, or in the simulator.
"""
import abc
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

import torch

# Elements in one slice of a cache-blocked push (:class:`Blocks`): 512 KiB of fp32 an array. A rule's
# chain touches about ten arrays (gradient, weights, backup, mean square, momentum buffer, look-ahead
# sum, answer, two or three scratch), about 5 MiB a slice: it stays in a core's L2 and its share of L3
# between one operation and the next, so each array crosses the memory bus about once a push, however
# many operations the rule has. Smaller slices pay torch's fixed cost per call (a few microseconds,
# about fifteen calls a slice) more often: 64 K to 256 K elements measured alike, 8 K twice as slow.
BLOCK = 1 << 17
# The slice with several lanes: torch's GRAIN_SIZE, up to which an operation runs on the calling
# thread alone, so each lane does not also start torch's own threads.
LANE_BLOCK = 1 << 15


class Rule(abc.ABC):
    """The update applied to a flat fp32 weight buffer when a gradient arrives."""

    name: str = "rule"

    def init(self, weights: torch.Tensor) -> Any:  # a dict here; a rule's own state class (DCState)
        """The rule's state for these weights (empty by default)."""
        return {}

    @abc.abstractmethod
    def apply_(self, weights: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], *,
               lr: float, staleness: int = 0, worker: int = 0) -> torch.Tensor:
        """Update ``weights`` in place with ``grad``; returns ``weights``."""


class Scratch:
    """Temporaries shaped as a given tensor, made at the first :meth:`take` (or again when a larger one
    or another dtype is asked for) and reused push after push: a server allocates nothing per push. A
    smaller request is answered with views of the kept tensors (a cache-blocked push's last, shorter
    slice)."""

    def __init__(self):
        self.held: List[torch.Tensor] = []

    def take(self, like: torch.Tensor, count: int) -> List[torch.Tensor]:
        """``count`` tensors shaped as ``like`` (their contents are the last user's)."""
        held, n = self.held, like.numel()
        if len(held) < count or held[0].numel() < n or held[0].dtype != like.dtype:
            held = self.held = [torch.empty_like(like) for _ in range(count)]
        if held[0].shape == like.shape:
            return held[:count]
        return [t.view(-1)[:n].view(like.shape) for t in held[:count]]


class Blocks:
    """A push applied slice by slice: :meth:`run` calls a chain of fused in-place operations on views of
    one slice of the shard at a time (every array of the rule sliced alike), so that the slice stays in
    cache from the chain's first operation to its last, with scratch tensors sized to one slice.

    Only an elementwise chain can be cut so: each element's result is the same whichever slice holds it.
    A reduction over the shard (a norm, a sum, a clip by a global norm, a ratio from a predictor) is
    taken before the chain, as a number the chain reads, or returned by the chain per slice and summed.

    Args:
        numel: the shard's elements.
        threads: lanes the slices are shared between (contiguous runs, one :class:`Scratch` each; the
            first lane is the calling thread). torch releases the GIL inside an operation, so lanes
            overlap their arithmetic; with more than one the slices are :data:`LANE_BLOCK` long.
        block: elements a slice (default :data:`BLOCK`, or :data:`LANE_BLOCK` with several lanes).

    Example::

        >>> w, g = torch.ones(5), torch.arange(5.0)
        >>> Blocks(5, block=2).run(lambda sl, scratch: float(w[sl].add_(g[sl], alpha=-0.5).sum()))
        0.0
        >>> w
        tensor([ 1.0000,  0.5000,  0.0000, -0.5000, -1.0000])

    Tuning: more lanes help where the server rank has cores of its own (``--server-threads``); where
    it shares them with busy workers each lane is taken from them.
    """

    def __init__(self, numel: int, *, threads: int = 1, block: Optional[int] = None):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1 (lanes a push's slices are shared between), "
                             f"got {threads!r}")
        if block is None:
            block = BLOCK if threads == 1 else LANE_BLOCK
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be an integer >= 1 (elements a slice), got {block!r}")
        self.slices = [slice(lo, min(lo + block, numel)) for lo in range(0, numel, block)]
        lanes = max(1, min(threads, len(self.slices)))
        self.scratch = [Scratch() for _ in range(lanes)]
        per_lane = -(-len(self.slices) // lanes)
        self._runs: Optional[List[range]] = [range(k * per_lane, min((k + 1) * per_lane, len(self.slices)))
                                              for k in range(lanes)]  # None once closed
        self._pool = ThreadPoolExecutor(lanes - 1, thread_name_prefix="hvd-async-blocks") if lanes > 1 else None

    def run(self, chain: Callable[[slice, Scratch], Optional[float]]) -> float:
        """``chain(slice, scratch)`` for every slice of the shard; returns the sum, in slice order, of what
        it returned (None counts 0: a chain that reduces nothing), the same for any number of lanes."""
        runs = self._runs
        if runs is None:
            raise RuntimeError("Blocks.run() after close(): the program that owns it was closed")
        if self._pool is None:
            scratch = self.scratch[0]
            return sum((chain(sl, scratch) or 0.0 for sl in self.slices), 0.0)
        parts = [0.0] * len(self.slices)

        def lane(k: int) -> None:
            for i in runs[k]:
                parts[i] = chain(self.slices[i], self.scratch[k]) or 0.0

        pending = [self._pool.submit(lane, k) for k in range(1, len(runs))]
        try:
            lane(0)
        finally:  # no lane still writes once this returns or raises
            for future in pending:
                future.exception()
        for future in pending:
            future.result()
        return sum(parts, 0.0)

    def close(self) -> None:
        """Stop the lanes' threads; a later :meth:`run` raises."""
        if self._pool is not None:
            self._pool.shutdown()
        self._runs = None
