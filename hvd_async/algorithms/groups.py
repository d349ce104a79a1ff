"""Option groups that several algorithms take, each declared once: its fields (default, help, flag)
and its check.

An algorithm's options dataclass inherits the groups it takes, and checks its own fields in its
``__post_init__`` after ``super().__post_init__()`` (each group checks its fields, then hands on).
A dataclass lists inherited fields from its last base to its first, so a class names its groups in
the reverse of the order its fields appear in (``--help``, the guide's tables)::

    @dataclass
    class MyOptions(LookaheadOption, PushRate):  # fields: push_rate, lookahead, then period
        period: int = option(4, "local steps between averagings", flag="--my-period")

        def __post_init__(self):
            super().__post_init__()
            ...                                 # period's check
"""
from dataclasses import dataclass
from typing import Any

from ..checks import is_int_at_least
from ..horovod_options import compression_name
from ..options import option

PUSH_RATES = ("average", "full")
PUSH_RATE_HELP = ("each push moves the global weights by 1/workers of the optimizer's step, so a round of "
                  "pushes makes one ssgd step at the same --lr (average), or by the whole step (full: workers "
                  "times ssgd's step per epoch)")
LOOKAHEAD_DEFAULT = True
LOOKAHEAD_HELP = ("on the servers: answer each push with the weights the workers' "
                  "momentum will carry the global ones to before this worker pushes again (DANA's look-ahead), "
                  "so its next gradient is computed near where it lands: what lets momentum 0.9 train with many "
                  "workers (softsync: with per-worker momentum; --no-lookahead: the plain weights)")
WORKER_LOOKAHEAD_HELP = ("on the workers: after each pull, carry the weights on by momentum x "
                         "their move since this worker's previous pull (the global weights' own momentum, seen "
                         "from the worker), so its next gradient is computed near where it lands "
                         "(--no-lookahead: the plain weights)")
INBOX_SLOTS_DEFAULT = 8
INBOX_SLOTS_HELP = ("inbox slots per server shard: a push claims a free one and the server frees it as soon as "
                    "it has taken the gradient, so the servers' inbox memory stops growing with the workers "
                    "past this many (0: one slot per worker, no claim)")
SERVER_MOMENTA = ("per-worker", "shared")
SERVER_MOMENTUM_DEFAULT = SERVER_MOMENTA[0]
SERVER_MOMENTUM_HELP = ("where the servers keep the pushes' momentum: a buffer per worker "
                        "(per-worker: a round of pushes makes one ssgd momentum step, and the look-ahead sums the "
                        "buffers), or one buffer every push goes through (shared, as MXNet's DC-ASGD keeps: no "
                        "momentum copy per worker on the servers; the look-ahead carries it over the next pushes)")
COMPRESSION_DEFAULT = "none"
COMPRESSION_HELP = ("'fp16': gradients and weights cross the network in half precision (the servers keep fp32 "
                    "weights and arithmetic)")


def check_choice(name: str, value, choices, meaning: str) -> None:
    """``value`` is one of ``choices``; else a ValueError naming the option, what each choice means
    (``meaning``) and the value given."""
    if value not in choices:
        raise ValueError(f"{name} must be {meaning}, got {value!r}")


@dataclass
class OptionGroup:
    """The end of the chain of checks every group's ``__post_init__`` hands on to."""

    def __post_init__(self):
        pass


@dataclass
class PushRate(OptionGroup):
    """How far one push moves the global weights (asgd, dbs-asgd, dc-asgd, lc-asgd, softsync)."""

    push_rate: str = option("average", PUSH_RATE_HELP, flag="--push-rate", choices=PUSH_RATES)

    def __post_init__(self):
        super().__post_init__()
        check_choice("push_rate", self.push_rate, PUSH_RATES, "'average' (each push moves the global weights by "
                     "1/workers of the optimizer's step: a round of pushes makes one ssgd step) or 'full' "
                     "(each push a whole step)")

    def push_scale(self, workers: int) -> float:
        """What one push's step is multiplied by: ``1 / workers`` under ``'average'``, else 1."""
        return 1.0 / workers if self.push_rate == "average" else 1.0


@dataclass
class LookaheadOption(OptionGroup):
    """DANA's look-ahead, on the servers (dc-asgd, lc-asgd, softsync)."""

    lookahead: bool = option(LOOKAHEAD_DEFAULT, LOOKAHEAD_HELP, flag="--lookahead", action="boolean")

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.lookahead, bool):
            raise ValueError(f"lookahead must be True or False, got {self.lookahead!r}")


@dataclass
class WorkerLookaheadOption(LookaheadOption):
    """The look-ahead estimated on the workers (asgd, dbs-asgd): the same option, its own help."""

    lookahead: bool = option(LOOKAHEAD_DEFAULT, WORKER_LOOKAHEAD_HELP, flag="--lookahead", action="boolean")


@dataclass
class ServerMomentum(OptionGroup):
    """Where a server program keeps momentum: a buffer per worker, or one shared by every push."""

    server_momentum: str = option(SERVER_MOMENTUM_DEFAULT, SERVER_MOMENTUM_HELP, flag="--server-momentum",
                                  choices=SERVER_MOMENTA)

    def __post_init__(self):
        super().__post_init__()
        check_choice("server_momentum", self.server_momentum, SERVER_MOMENTA, "'per-worker' (one buffer per "
                     "worker on the servers) or 'shared' (one buffer every push goes through)")

    @property
    def shared_momentum(self) -> bool:
        return self.server_momentum == "shared"


@dataclass
class Compression(OptionGroup):
    """Half precision on the wire, fp32 on the servers (the mailbox algorithms)."""

    compression: Any = option(COMPRESSION_DEFAULT, COMPRESSION_HELP)

    def __post_init__(self):
        super().__post_init__()
        self.compression = compression_name(self.compression)

    def wire(self) -> str:
        """The windows' wire format: 'fp16' or 'fp32'."""
        return "fp16" if self.compression == "fp16" else "fp32"


@dataclass
class InboxSlots(OptionGroup):
    """How many shard-sized inbox slots each server keeps (the mailbox algorithms)."""

    inbox_slots: int = option(INBOX_SLOTS_DEFAULT, INBOX_SLOTS_HELP, flag="--inbox-slots")

    def __post_init__(self):
        super().__post_init__()
        if not is_int_at_least(self.inbox_slots, 0):
            raise ValueError(f"inbox_slots must be an integer >= 0 (slots per server shard; 0: one per "
                             f"worker), got {self.inbox_slots!r}")

    def slots(self, workers: int) -> int:
        """The windows' ``slots``: 0 (one per worker) unless the pool is smaller than the workers."""
        return self.inbox_slots if 0 < self.inbox_slots < workers else 0


@dataclass
class PullEvery(OptionGroup):
    """How often a worker reads the global weights (asgd, dbs-asgd)."""

    pull_every: int = option(1, "pull the global weights every k steps", flag="--pull-every")

    def __post_init__(self):
        super().__post_init__()
        if not is_int_at_least(self.pull_every, 1):
            raise ValueError(f"pull_every must be an integer >= 1 (pull the global weights every k "
                             f"steps), got {self.pull_every!r}")
