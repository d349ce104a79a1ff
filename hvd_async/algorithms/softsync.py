"""softsync (n-softsync): the servers apply the mean of every ``floor(workers / n)`` gradients."""
import warnings
from dataclasses import dataclass
from typing import Optional

from ..checks import is_int_at_least, user_stacklevel
from ..options import option
from .aggregate import AggregateProgram
from .compensation import ServerKernelOption
from .groups import (SERVER_MOMENTA, SERVER_MOMENTUM_DEFAULT, Compression, InboxSlots, LookaheadOption,
                     OptionGroup, PushRate, ServerMomentum, check_choice)
from .ps import MailboxAlgorithm, MailboxStrategy


@dataclass
class AggregateOptions(OptionGroup):
    """softsync's aggregate: how many gradients, and their rates (the first of its own fields)."""

    n: Optional[int] = option(None, "apply an update per floor(workers/N) gradients, N in 1..workers "
                              "(default: workers)", flag="--softsync-n", metavar="N")
    staleness_lr: bool = option(False, "divide each gradient's rate by its staleness (the paper's rule)",
                                flag="--softsync-staleness-lr", action="store_true")

    def __post_init__(self):
        super().__post_init__()
        if self.n is not None and not is_int_at_least(self.n, 1):
            raise ValueError(f"n must be an integer between 1 and the number of workers, got {self.n!r}")
        if not isinstance(self.staleness_lr, bool):
            raise ValueError(f"staleness_lr must be True or False, got {self.staleness_lr!r}")


@dataclass
class DeprecatedMomentum(ServerMomentum):
    """softsync's ``momentum`` (``--softsync-momentum``), the name it had before the servers' momentum
    took one name for every algorithm (``server_momentum``, ``--server-momentum``): still accepted,
    with a FutureWarning, and moved onto ``server_momentum``."""

    momentum: Optional[str] = option(None, "deprecated: the old name of --server-momentum (same values)",
                                     flag="--softsync-momentum", choices=SERVER_MOMENTA)

    def __post_init__(self):
        if self.momentum is not None:
            check_choice("momentum", self.momentum, SERVER_MOMENTA, "'per-worker' or 'shared' (and name it "
                         "server_momentum: momentum is its deprecated name)")
            if self.server_momentum not in (SERVER_MOMENTUM_DEFAULT, self.momentum):
                raise ValueError(f"momentum={self.momentum!r} and server_momentum={self.server_momentum!r} say two "
                                 f"things; give server_momentum alone (momentum is its deprecated name)")
            warnings.warn(f"softsync's momentum={self.momentum!r} (--softsync-momentum) is deprecated and will be "
                          f"removed: use server_momentum={self.momentum!r} (--server-momentum), the name dc-asgd "
                          f"and lc-asgd use", FutureWarning, stacklevel=user_stacklevel())
            self.server_momentum, self.momentum = self.momentum, None
        super().__post_init__()


@dataclass
class SoftSyncOptions(ServerKernelOption, LookaheadOption, PushRate, DeprecatedMomentum, InboxSlots, Compression,
                      AggregateOptions):
    """softsync's options: n and staleness_lr, compression, server momentum, push rate, look-ahead, the
    servers' kernel."""


class SoftSync(MailboxStrategy):
    """softsync (n-softsync): the server applies one update per ``c = floor(workers / n)`` gradients
    (their mean, each optionally divided by its staleness); ``n=1`` is synchronous SGD, ``n=workers``
    asgd.

    Options:
        n: 1 .. workers (default: workers).
        push_rate: ``'average'`` (default: an aggregate of ``c`` gradients takes ``c / workers``
            of ``lr``, so the ``n`` aggregates of a round of pushes make one ssgd step, as asgd's
            pushes do) or ``'full'`` (``lr`` per aggregate).
        staleness_lr: divide each gradient's rate by ``max(1, staleness)`` (the paper's rule;
            default False: on top of ``push_rate='average'`` it cuts the progress per epoch again).
        compression: as dc-asgd's (fp16 on the wire, fp32 on the servers).
        server_momentum: ``'per-worker'`` (default: each worker's gradients go through a momentum buffer of
            its own, as in dc-asgd and asgd, and an aggregate is the mean of the workers' directions,
            so ``n=1`` is ssgd and ``n=workers`` with ``staleness_lr=False`` is asgd with
            ``push_rate='full'``) or ``'shared'`` (one buffer for every aggregate).
        lookahead: with per-worker momentum, answer each push with the look-ahead weights, as
            dc-asgd does (default True).
    """

    scales_on_server = True  # an aggregate's rate is set where it is known how many gradients it holds

    def __init__(self, optimizer, named_parameters, transport, options):
        SoftSyncAlgorithm.resolve_options(options, transport.size)  # (a transport given by the caller)
        super().__init__(optimizer, named_parameters, transport, options)


class SoftSyncAlgorithm(MailboxAlgorithm):
    """softsync's declaration: ``n`` resolved from the workers, its program, an outbox only where the
    answers differ per worker."""

    Options = SoftSyncOptions
    strategy = SoftSync

    @classmethod
    def resolve_options(cls, options, workers: int) -> None:
        if options.n is None:
            options.n = workers
        if not 1 <= options.n <= workers:
            raise ValueError(f"n must be between 1 and the number of workers ({workers}), got {options.n}")

    @classmethod
    def check_for_job(cls, given, *, workers, lr: float) -> None:
        n = given.get("n")
        if isinstance(n, int) and (n < 1 or (workers is not None and n > workers)):
            raise ValueError(f"n {n} must be between 1 and the number of workers ({workers})")

    @classmethod
    def outbox_for(cls, options) -> bool:
        """An outbox only for the per-worker look-ahead, whose answer differs per worker, or under fp16
        compression (the answer crosses in half precision; the weights window is fp32); otherwise every
        pusher reads the weights window after its answer, and the servers hold no copy per worker."""
        return (not options.shared_momentum and options.lookahead) or options.compression == "fp16"

    @classmethod
    def server_program(cls, host):
        return SoftSyncProgram(host, cls.server_spec(host))


class SoftSyncProgram(AggregateProgram):
    """softsync's server side: the mean of every ``c = floor(workers / n)`` gradients, one update; built
    from softsync's options (``n`` resolved)."""

    def __init__(self, host, options: SoftSyncOptions):
        c = max(1, host.spec.workers // options.n)
        # 'average': an aggregate of c gradients takes c / workers of the rate, so that the
        # aggregates of one round of pushes (one per worker) make one ssgd step
        super().__init__(host, every=c, rate=c / host.spec.workers if options.push_rate == "average" else 1.0,
                         staleness_lr=options.staleness_lr, shared_momentum=options.shared_momentum,
                         lookahead=options.lookahead, server_kernel=options.server_kernel)
