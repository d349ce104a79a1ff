"""An algorithm's declaration: what the registry, the launcher, the servers and the simulator ask of
it before any worker's strategy exists.

Each algorithm is two classes: its declaration (a subclass of :class:`Algorithm`: the options, the
worker-side strategy, how its servers' windows work, the option checks and the transport it opens)
and its :class:`~hvd_async.algorithms.base.Strategy` (what one worker does at each step). The
capabilities the job and the tools choose by (servers, synchronous, peer windows, replayable) are
declared once, in the algorithm's registry row (:class:`hvd_async.registry.AlgorithmInfo`).
"""
from typing import Any, ClassVar, Dict, Optional

from ..transport.window.layout import WindowSpec
from .groups import Compression, InboxSlots


class Algorithm:
    """One algorithm's declaration; a subclass per algorithm sets ``Options`` and ``strategy`` and
    overrides the hooks whose defaults do not fit it. The hooks are class methods: nothing is built.

    Attributes:
        name: the registry's name for it (the registry sets it from the row; not declared here).
        Options: the options dataclass (validates itself in ``__post_init__``; an empty one where the
            algorithm takes none).
        strategy: the worker-side :class:`~hvd_async.algorithms.base.Strategy` subclass.
        mode: where it keeps global weights on server ranks, how its windows work: ``"accumulate"`` (the
            workers add their changes into the weights) or ``"mailbox"`` (the rule runs in the servers'
            program).
        fused_sgd: the job may build its SGD with ``fused=True`` on CUDA (ssgd: the fused kernel skips
            a non-finite step itself, so nothing is read on the host).
        runs_user_optimizer: False where the update rule runs on the servers or as a global step the
            algorithm makes itself (the wrapped SGD's hyperparameters are read, its state unused).
    """

    name: ClassVar[str] = "algorithm"
    Options: ClassVar[type]
    strategy: ClassVar[type]
    mode: ClassVar[str] = "accumulate"
    fused_sgd: ClassVar[bool] = False
    runs_user_optimizer: ClassVar[bool] = True

    @classmethod
    def uses_servers(cls, options: Dict[str, Any], registered: bool) -> bool:
        """Whether a job with these keyword ``options`` needs server ranks (default: what the registry
        row says, ``registered``; od-sgd's allreduce exchange needs none)."""
        return registered

    @classmethod
    def simulated(cls, options: Dict[str, Any]) -> bool:
        """Whether ``hvd-async simulate`` can run it with these keyword options: it runs the strategy
        over simulated transports on one thread, so an exchange with a thread of its own cannot."""
        return True

    @classmethod
    def check_for_job(cls, given: Dict[str, Any], *, workers: Optional[int], lr: float) -> None:
        """The checks of ``hvd-async train`` and ``simulate`` that need the job's other values
        (``workers``: None where not known yet), on the keyword options its flags set, before the
        options dataclass checks them: a ValueError whose message starts with the option's name and
        its value (the command line shows the flag instead of the name)."""

    @classmethod
    def resolve_options(cls, options, workers: int) -> None:
        """Fill in the options' defaults that depend on the number of workers (softsync's n), in
        place, before any server is asked to open anything."""

    @classmethod
    def check_optimizer(cls, optimizer) -> None:
        """Raise if this algorithm cannot run with ``optimizer`` (called before any exchange opens)."""

    @classmethod
    def make_transport(cls, named_parameters, options, comms):
        """The transport this algorithm uses when the caller gives none (Horovod collectives), opened by
        ``comms`` (:class:`hvd_async.runtime.Comms`, or the simulator's stand-in)."""
        return comms.collectives()

    @classmethod
    def server_options(cls, options) -> Dict[str, Any]:
        """What the server ranks' program needs of the options (parameter-server algorithms)."""
        return {}

    @classmethod
    def outbox_for(cls, options) -> bool:
        """Mailbox mode: whether the servers answer through an outbox slot per worker under these
        options (dc-asgd keeps its backups there; softsync, only where the answers differ per worker).
        False: the workers read the weights window themselves, and a pull's copy comes back through an
        inbox slot (od-sgd)."""
        return True

    @classmethod
    def window_spec(cls, options, numel: int, servers: int, workers: int) -> WindowSpec:
        """The servers' windows for this algorithm under ``options`` (resolved, see
        :meth:`resolve_options`): the one place that decides their server options, wire format,
        inbox slots and outbox, for the job's transport, the simulator and the benchmarks alike."""
        return WindowSpec(cls.name, cls.mode, int(numel), servers, workers, cls.server_options(options),
                          options.wire() if isinstance(options, Compression) else "fp32",
                          options.slots(workers) if isinstance(options, InboxSlots) else 0, cls.outbox_for(options))

    @classmethod
    def server_program(cls, host):
        """What the server ranks run for this algorithm (parameter-server algorithms only)."""
        raise RuntimeError(f"algorithm {cls.name!r} uses no parameter server")
