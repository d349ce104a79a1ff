"""How bytes move: Horovod collectives, in-process loopback (tests); MPI windows come with the parameter server."""
from .base import CollectiveTransport, ReduceOp, Transport
from .loopback import LoopbackGroup, LoopbackTransport

__all__ = ["CollectiveTransport", "ReduceOp", "Transport", "LoopbackGroup", "LoopbackTransport",
           "HorovodTransport"]


def __getattr__(name):
    if name == "HorovodTransport":  # imported lazily: Horovod is heavy and absent on server ranks' path
        from .horovod import HorovodTransport

        return HorovodTransport
    raise AttributeError(name)
