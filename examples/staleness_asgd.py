"""Staleness-aware asgd, a server-side algorithm added to hvd_async from outside the package.

Each push's gradient is applied on the parameter servers at the rate ``lr / max(1, staleness)``
(staleness: the pushes other workers made since this worker last received the weights), through a
momentum buffer per worker, as dc-asgd keeps. The rate division is the staleness-dependent learning
rate of Zhang, Gupta, Lian, Liu, "Staleness-aware async-SGD for distributed deep learning" (IJCAI
2016), applied one push at a time (softsync's n = workers, with --softsync-staleness-lr, aggregates
instead).

Importing this file registers the algorithm ``staleness-asgd``; nothing inside ``hvd_async`` names it.

    hvd-async simulate --plugin examples/staleness_asgd.py --algo staleness-asgd --workers 4
    hvd-async train --plugin examples/staleness_asgd.py --algo staleness-asgd --np 5 --servers 1

The pieces a server-side plugin supplies, all from the parameter-server family's public modules:
its options (here only the family's push-rate group), a strategy (``MailboxStrategy``: the worker
pushes its gradient with the wrapped SGD's hyperparameters as an ``SGDPayload`` and loads the weights
the server answers with), a server program (``MailboxProgram``: snapshots, idle/resume and the
non-finite check come with it; ``on_push`` is the rule) and the declaration that names the three
(``MailboxAlgorithm``: the wrapped optimizer checked to be SGD, the options sent to the servers).
"""
from dataclasses import dataclass

import hvd_async
from hvd_async.algorithms.groups import PushRate
from hvd_async.algorithms.ps import MailboxAlgorithm, MailboxProgram, MailboxStrategy
from hvd_async.transport import window

NAME = "staleness-asgd"


@dataclass
class StalenessASGDOptions(PushRate):
    """The push rate (``'average'``: ``lr / workers`` per push before the staleness division)."""


class StalenessProgram(MailboxProgram):
    """A shard's side: each push applied at ``lr / max(1, staleness)`` through its worker's buffer."""

    def __init__(self, host, options: StalenessASGDOptions):
        super().__init__(host)
        self.momentum = [{} for _ in range(host.spec.workers)]

    def on_push(self, worker, grad, payload, grad_norm=None) -> None:
        staleness = self.staleness(worker)
        kwargs = payload.sgd_kwargs()
        kwargs["lr"] /= max(1, staleness)
        self.sgd.apply_(self.host.weights, grad, self.momentum[worker], **kwargs)
        self.host.bump([staleness])
        self.snapshot(worker)
        self.host.answer(worker, staleness, window.Status.APPLIED)


class StalenessASGD(MailboxStrategy):
    """staleness-asgd: asgd whose servers divide each push's rate by its staleness.

    Wrap a ``torch.optim.SGD``: its ``lr``, ``momentum``, ``weight_decay`` and ``nesterov`` travel with
    every push (read at every step, so schedulers work).

    Example::

        opt = hvd_async.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                             named_parameters=model.named_parameters(),
                                             algorithm="staleness-asgd")
    """


class StalenessASGDAlgorithm(MailboxAlgorithm):
    """The declaration: its options, its strategy, its servers' program."""

    Options = StalenessASGDOptions
    strategy = StalenessASGD

    @classmethod
    def server_program(cls, host):
        return StalenessProgram(host, cls.server_spec(host))


def register() -> None:
    hvd_async.register_algorithm(NAME, StalenessASGDAlgorithm, summary="asgd with each push's rate divided by its "
                                 "staleness, on the servers", paper="Zhang, Gupta, Lian, Liu, IJCAI 2016",
                                 uses_servers=True)


register()
