"""dc-asgd's and lc-asgd's server push (and softsync's one-push aggregate) as one compiled loop over the shard.

The eager push (``DCProgram.on_push``: :meth:`DCRule.term_of`, :meth:`SGDRule.step_` and the answer,
slice by slice through :class:`~hvd_async.rules.Blocks`) is about fifteen torch operations a slice, each
a loop of its own over cache-resident arrays: several times the time that moving the push's bytes
takes. Here the same arithmetic is written once, as elementwise expressions, and compiled by
``torch.compile`` (inductor's CPU code generation, with the C++ compiler the setup installs) into one
loop that reads each array once and writes each once a push: the gradient; the weights, the mean
square, the momentum buffer and the look-ahead's sum (read and written); the worker's outbox slot
(read as its backup ``w_bak``, written as its answer). The result equals the eager push's to fp32
rounding (the operations are the same, their order within an element differs).

A compile takes seconds, once per process and variant (which buffers the push has: adaptive or not,
a compensation term or not, momentum, a look-ahead sum, the answer's form); :meth:`FusedPush.warm_up`
compiles the variant a program expects before its first push, on small tensors (shapes are left
dynamic, so the shard's size compiles nothing more). Pushes the kernel does not cover (Nesterov
momentum, fp16 outbox slots) take the eager chain.

backup-sgd's round (:meth:`FusedPush.round_`) is the same step on the sum of the round's gradients,
read where they landed (their inbox slots) rather than folded into a running sum as each comes: one
loop reads the gradients, the weights and the momentum buffer, and writes the weights, the buffer and
every accepted worker's answer.
"""
import logging
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

logger = logging.getLogger(__name__)

KERNELS = ("auto", "compiled", "eager")
# auto compiles for shards of at least this many elements (4 MiB of fp32): below, the eager chain's
# slices stay in cache and a push takes well under a millisecond, and nothing waits for a compile
COMPILE_MIN = 1 << 20
ANSWERS = ("none", "weights", "ahead", "ahead_buffer")
# compiled variants a process may keep (torch's own limit per function is 8, fewer than the variants)
RECOMPILE_LIMIT = 64
_COMPILED: Optional[Callable] = None  # _push compiled, one per process: its variants and shapes share a cache
_COMPILED_ROUND: Optional[Callable] = None  # _round compiled, likewise


class Variant(NamedTuple):
    """Which arrays a push reads and writes: the compiled loop's shape, one compile each.

    Attributes:
        adaptive: the mean square is updated and the term divided by its root (DC-ASGD-a).
        compensated: the term ``lam * g * g * (w - w_bak)`` is added (``lam`` > 0, the push compensated).
        momentum: the step goes through a momentum buffer (heavy ball).
        total: a look-ahead sum follows the buffer (per-worker buffers).
        answer: ``'none'`` (no outbox), ``'weights'``, ``'ahead'`` (``w - step * sum``) or
            ``'ahead_buffer'`` (``w - step * buf``, one buffer shared by every push).
        scaled: lc-asgd's ratio ``r`` is not 1 (the change's size then counts ``(r - 1) * g``).
    """

    adaptive: bool
    compensated: bool
    momentum: bool
    total: bool
    answer: str
    scaled: bool


def _push(weights, grad, slot, mean_square, buf, total, s, adaptive: bool, compensated: bool, momentum: bool,
          with_total: bool, answer: str, scaled: bool):
    """One push, elementwise (compiled per variant). ``s`` holds the push's numbers: lam, the mean
    square's decay, eps, the step's factor ``c`` (lc-asgd's ``r`` times the push clip's), momentum,
    weight decay, lr, the look-ahead's step, ``r``. Returns the squared norm of what the step adds to
    the gradient (before the push clip), as the eager chain's ``change_sq`` does."""
    lam, decay, eps, c, mom, wd, lr, step, r = (s[k] for k in range(9))
    term = None
    if adaptive:
        mean_square_new = mean_square * decay + grad * grad * (1 - decay)
        mean_square.copy_(mean_square_new)
    if compensated:
        term = lam * ((weights - slot) * grad * grad)
        if adaptive:
            term = term / torch.sqrt(mean_square_new + eps)
    direction = grad * c + weights * wd
    if term is not None:
        direction = direction + term * c
    if momentum:
        buf_new = buf * mom + direction
        if with_total:
            total_new = total - buf + buf_new
            total.copy_(total_new)
        buf.copy_(buf_new)
        direction = buf_new
    weights_new = weights - lr * direction
    weights.copy_(weights_new)
    if answer == "weights":
        slot.copy_(weights_new)
    elif answer == "ahead":
        slot.copy_(weights_new - step * total_new)
    elif answer == "ahead_buffer":
        slot.copy_(weights_new - step * buf_new)
    if scaled:
        change = (r - 1) * grad if term is None else (r - 1) * grad + r * term
        return (change * change).sum()
    return torch.zeros(()) if term is None else (term * term).sum()


def _round(weights, buf, grads: List[torch.Tensor], slots: List[torch.Tensor], s, momentum: bool):
    """backup-sgd's update, elementwise (compiled per number of gradients and answers): the step with
    ``c * sum(grads)`` (summed in the given order, as a running sum folds them) through the momentum
    buffer, then the new weights into each slot. ``s`` holds the factor ``c`` (the mean's ``1/k``),
    momentum, weight decay and lr."""
    c, mom, wd, lr = s[0], s[1], s[2], s[3]
    total = grads[0]
    for grad in grads[1:]:
        total = total + grad
    direction = total * c + weights * wd
    if momentum:
        buf_new = buf * mom + direction
        buf.copy_(buf_new)
        direction = buf_new
    weights_new = weights - lr * direction
    weights.copy_(weights_new)
    for slot in slots:
        slot.copy_(weights_new)


class FusedPush:
    """The compiled push for one server program; callable as the eager chain's replacement.

    Args:
        label: what the log lines call it (``"dc-asgd"``).
    """

    def __init__(self, label: str):
        self.label = label
        self.compile_seconds = 0.0  # the compiles this process made for it, all variants
        self.calls = 0  # pushes applied (__call__)
        self.rounds = 0  # backup-sgd's updates from the gradients where they landed (round_)
        self._seen: Dict[object, bool] = {}  # the variants (and rounds) compiled
        self.numbers = torch.zeros(9)
        self.round_numbers = torch.zeros(4)

    @staticmethod
    def wanted(kernel: str, numel: int) -> bool:
        """Whether a program with option ``kernel`` (:data:`KERNELS`) on a shard of ``numel`` elements
        uses the compiled push."""
        return kernel == "compiled" or (kernel == "auto" and numel >= COMPILE_MIN)

    def warm_up(self, variant: Variant) -> float:
        """Compile ``variant`` now, on small tensors of two sizes (the second makes the compiled
        shape general); returns the seconds it took (0 where it was compiled already)."""
        if variant in self._seen:  # (every push asks: nothing built before this)
            return 0.0

        def run(n: int) -> None:
            weights, grad = torch.zeros(n), torch.zeros(n)
            slot, mean_square, buf, total = (torch.zeros(n) if use else weights[:0] for use in _used(variant))
            self._call(variant, weights, grad, slot, mean_square, buf, total, torch.zeros(9))
        return self._compile(variant, f"push {_describe(variant)}", run)

    def warm_up_round(self, grads: int, answers: int, momentum: bool) -> float:
        """:meth:`warm_up` for :meth:`round_` with ``grads`` gradients and ``answers`` answer slots."""
        key = ("round", grads, answers, momentum)
        if key in self._seen:  # (every round asks)
            return 0.0

        def run(n: int) -> None:
            weights = torch.zeros(n)
            self._call_round(weights, torch.zeros(n) if momentum else weights[:0],
                             [torch.zeros(n) for _ in range(grads)], [torch.zeros(n) for _ in range(answers)],
                             torch.zeros(4), momentum)
        return self._compile(key, f"update of {grads} gradients ({answers} "
                                  f"answers{', momentum' if momentum else ''})", run)

    def _compile(self, key, description: str, run: Callable[[int], None]) -> float:
        """``run`` the loop ``key`` names on tensors of two sizes (the second makes the compiled shape
        general; both above 4096, where inductor keeps a reduction in several lanes) and note ``key``
        as compiled; returns the seconds it took."""
        start = time.perf_counter()
        for n in (8192, 12288):
            run(n)
        seconds = time.perf_counter() - start
        self._seen[key] = True
        self.compile_seconds += seconds
        logger.info("%s: compiled the server's %s in %.1f s", self.label, description, seconds)
        return seconds

    def ready_round(self, grads: int, answers: int, momentum: bool) -> bool:
        """:meth:`ready` for :meth:`round_`."""
        return self._ready(lambda: self.warm_up_round(grads, answers, momentum))

    def ready(self, variant: Variant) -> bool:
        """:meth:`warm_up`, and False where torch cannot compile here (no C++ compiler, an unsupported
        platform): said once in a warning, and the program keeps its eager push."""
        return self._ready(lambda: self.warm_up(variant))

    def _ready(self, warm_up: Callable[[], float]) -> bool:
        try:
            warm_up()
            return True
        except Exception as exc:  # (inductor's errors have no common base class)
            logger.warning("%s: the compiled push is unavailable here (%s: %s); pushes take the eager chain "
                           "(--server-kernel eager says so up front)", self.label, type(exc).__name__,
                           str(exc).splitlines()[0] if str(exc) else "")
            return False

    @staticmethod
    def traffic(variant: Variant, numel: int) -> Tuple[int, int]:
        """The bytes one push of ``variant`` reads and writes over a shard of ``numel`` fp32 elements:
        each array it touches once (the gradient and the weights always)."""
        slot, mean_square, buf, total = _used(variant)
        read = 2 + variant.compensated + mean_square + buf + total
        written = 1 + (variant.answer != "none") + mean_square + buf + total
        return 4 * numel * read, 4 * numel * written

    @staticmethod
    def round_traffic(grads: int, answers: int, momentum: bool, numel: int) -> Tuple[int, int]:
        """The bytes :meth:`round_` reads and writes over a shard of ``numel`` fp32 elements."""
        return 4 * numel * (grads + 1 + momentum), 4 * numel * (1 + momentum + answers)

    @staticmethod
    def _call_round(weights, buf, grads, slots, numbers, momentum: bool):
        global _COMPILED_ROUND
        if _COMPILED_ROUND is None:
            _COMPILED_ROUND = torch.compile(_round, dynamic=True, fullgraph=True)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            _COMPILED_ROUND(weights, buf, list(grads), list(slots), numbers, momentum)

    def round_(self, weights: torch.Tensor, buf: Optional[torch.Tensor], grads: Sequence[torch.Tensor],
               slots: Sequence[torch.Tensor], factor: float, momentum: float, weight_decay: float, lr: float) -> None:
        """backup-sgd's update in place: ``w <- w - lr * d`` with ``d`` the momentum buffer's step on
        ``factor * sum(grads) + weight_decay * w`` (``buf``: None without momentum), and the new
        weights written into each of ``slots`` (the accepted workers' answers)."""
        self.warm_up_round(len(grads), len(slots), bool(momentum))
        for tensor in list(grads) + list(slots) + ([buf] if momentum else []):
            if tensor is None or tensor.shape != weights.shape or tensor.dtype != weights.dtype:
                raise ValueError("backup-sgd's compiled update needs fp32 gradients, answers and buffer shaped as "
                                 "the weights")
        self.round_numbers.copy_(torch.tensor((factor, momentum, weight_decay, lr), dtype=torch.float32))
        self._call_round(weights, buf if momentum else weights[:0], grads, slots, self.round_numbers, bool(momentum))
        self.rounds += 1

    @staticmethod
    def _call(variant: Variant, weights, grad, slot, mean_square, buf, total, numbers):
        global _COMPILED
        if _COMPILED is None:
            _COMPILED = torch.compile(_push, dynamic=True, fullgraph=True)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return _COMPILED(weights, grad, slot, mean_square, buf, total, numbers, variant.adaptive,
                                  variant.compensated, variant.momentum, variant.total, variant.answer,
                                  variant.scaled)

    def __call__(self, variant: Variant, weights: torch.Tensor, grad: torch.Tensor, slot: Optional[torch.Tensor],
                 mean_square: Optional[torch.Tensor], buf: Optional[torch.Tensor], total: Optional[torch.Tensor],
                 numbers: Tuple[float, ...]) -> float:
        """One push in place (``slot``: the worker's outbox slot, read as the backup where
        ``variant.compensated``, written as the answer; None-tensors are those the variant does not
        touch); returns the change's squared norm."""
        self.warm_up(variant)
        self.numbers.copy_(torch.tensor(numbers, dtype=torch.float32))
        given = (slot, mean_square, buf, total)
        for name, use, tensor in zip(("slot", "mean_square", "buf", "total"), _used(variant), given):
            if use and (tensor is None or tensor.shape != weights.shape):
                raise ValueError(f"the {_describe(variant)} push needs {name} shaped as the weights")
        slot, mean_square, buf, total = (tensor if use and tensor is not None else weights[:0]
                                         for use, tensor in zip(_used(variant), given))
        found = float(self._call(variant, weights, grad, slot, mean_square, buf, total, self.numbers))
        self.calls += 1
        return found


def _used(variant: Variant) -> Tuple[bool, bool, bool, bool]:
    """Which of (slot, mean square, buffer, sum) ``variant`` reads or writes (the others are passed
    empty, so that their sizes never change what was compiled)."""
    return (variant.compensated or variant.answer != "none", variant.adaptive, variant.momentum, variant.total)


def _describe(variant: Variant) -> str:
    parts = [name for name in ("adaptive", "compensated", "momentum", "total", "scaled") if getattr(variant, name)]
    return f"({', '.join(parts) or 'plain'}; answer {variant.answer})"
