"""What a push carries to a parameter server's program: a typed payload per program, whose fields
are encoded in declaration order into the request's float slots (the window transport moves the
floats and knows no field). Adding a field is one line in the payload that needs it."""
import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Sequence, Union

import torch

from ..transport import window

if TYPE_CHECKING:
    import numpy as np


@dataclasses.dataclass(frozen=True)
class Payload:
    """Base of a server program's payload: subclasses declare ``float`` or ``bool`` fields, each with a
    default (what an unset slot decodes to: 0). A field's slot is its position in declaration order,
    a subclass's fields after its parent's, ``PAYLOAD_LEN`` slots in all.

    Example::

        @dataclass(frozen=True)
        class StalenessPayload(SGDPayload):
            pulled_version: float = 0.0      # slot 4, after SGD's four
    """

    def encode(self) -> Dict[int, float]:
        """``{slot: value}`` for :meth:`WindowTransport.request_async`."""
        fields = dataclasses.fields(self)
        if len(fields) > window.PAYLOAD_LEN:
            raise TypeError(f"{type(self).__name__} declares {len(fields)} fields; a request carries "
                            f"{window.PAYLOAD_LEN}: merge fields or drop one")
        return {slot: float(getattr(self, field.name)) for slot, field in enumerate(fields)}

    @classmethod
    def decode(cls, slots: Union[Sequence[float], "np.ndarray"]) -> "Payload":
        """The payload a request's float slots hold (``Request.payload``)."""
        return cls(**{field.name: _typed(field, slots[slot]) for slot, field in enumerate(dataclasses.fields(cls))})


def _typed(field: dataclasses.Field, value: float) -> Any:
    return bool(value) if field.type in (bool, "bool") else float(value)


@dataclasses.dataclass(frozen=True)
class SGDPayload(Payload):
    """The SGD hyperparameters of the wrapped optimizer, for a rule that runs on the servers (read at
    every push, so schedulers work)."""

    lr: float = 0.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def sgd_kwargs(self) -> Dict[str, Any]:
        """The keywords of :meth:`hvd_async.rules.SGDRule.apply_`."""
        return {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay,
                "nesterov": self.nesterov}


def server_sgd_hyper(algorithm: str, optimizer) -> SGDPayload:
    """The SGD hyperparameters a push carries to a server-side rule, read from the param groups now
    (so schedulers work); raises where the server cannot apply what the optimizer says."""
    groups = optimizer.param_groups
    first = groups[0]
    if first.get("maximize", False):
        raise ValueError(f"{algorithm}: maximize=True is not supported on the server; minimise the "
                         f"negated objective instead")
    if first.get("dampening", 0):
        raise ValueError(f"{algorithm}: dampening={first['dampening']} is not supported; use 0")
    for group in groups[1:]:
        for key in ("lr", "momentum", "weight_decay", "nesterov"):
            if group.get(key) != first.get(key):
                raise ValueError(f"{algorithm} applies one rate on the server: every param group "
                                 f"must share {key} (got {first.get(key)} and {group.get(key)})")
    return SGDPayload(lr=float(first["lr"]), momentum=float(first.get("momentum", 0.0)),
                      weight_decay=float(first.get("weight_decay", 0.0)),
                      nesterov=bool(first.get("nesterov", False)))


def check_server_sgd(algorithm: str, optimizer) -> None:
    """The rule runs on the servers with SGD's hyperparameters: the wrapped optimizer must be SGD."""
    if not isinstance(optimizer, torch.optim.SGD):
        from .. import registry

        anything = [name for name in registry.names() if registry.algorithm(name).runs_user_optimizer]
        raise TypeError(f"{algorithm} applies its SGD rule on the parameter servers: wrap a "
                        f"torch.optim.SGD (got {type(optimizer).__name__}); these run any optimizer: "
                        f"{', '.join(anything)}")
    server_sgd_hyper(algorithm, optimizer)
