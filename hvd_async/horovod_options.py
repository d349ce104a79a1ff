"""Horovod's DistributedOptimizer options, accepted by every algorithm and checked in one place.

Each option keeps Horovod's name, default and meaning. An algorithm gives an option a meaning by
naming it in its strategy's ``horovod_options``; a value other than the default under an algorithm
that does not name it gets one line saying so and naming the algorithms where it works.
"""
import warnings
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterable, Mapping

from .checks import is_finite_number, user_stacklevel

# Options that only tune speed (how Horovod fuses allreduces): ignored with a warning elsewhere.
SPEED_ONLY = ("num_groups", "groups")


@dataclass
class HorovodOptions:
    """The keyword options of ``horovod.torch.DistributedOptimizer``, with Horovod's defaults."""

    compression: Any = None              # hvd.Compression.none / .fp16 (or 'none' / 'fp16')
    backward_passes_per_step: int = 1    # backward passes summed locally per step()
    op: Any = "average"                  # hvd.Average (default) / hvd.Sum; hvd.Adasum is refused
    gradient_predivide_factor: float = 1.0  # scale gradients by 1/f before the sum, f after
    num_groups: int = 0                  # allreduce fusion groups (speed only)
    groups: Any = None                   # explicit fusion groups (speed only)
    sparse_as_dense: bool = False        # densify sparse gradients before the exchange
    process_set: Any = None              # a Horovod process set (ssgd); None or the global one: all workers

    def __post_init__(self):
        bpps = self.backward_passes_per_step
        if isinstance(bpps, bool) or not isinstance(bpps, int) or bpps < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {bpps!r}")
        f = self.gradient_predivide_factor
        if not is_finite_number(f) or f <= 0:
            raise ValueError(f"gradient_predivide_factor must be a finite number > 0, got {f!r}")
        if not isinstance(self.sparse_as_dense, bool):
            raise ValueError(f"sparse_as_dense must be True or False, got {self.sparse_as_dense!r}")
        self.compression = compression_name(self.compression)
        self.op = op_name(self.op)
        if f != 1.0 and self.op != "average":  # Horovod's own check, in its words
            raise ValueError(f"gradient_predivide_factor not supported with op != Average (got "
                             f"gradient_predivide_factor={f!r}, op={self.op!r}); leave the factor at 1.0 "
                             f"with op=hvd.Sum")
        if self.process_set is not None:
            set_id = getattr(self.process_set, "process_set_id", None)
            if set_id is None:
                raise ValueError(f"process_set={self.process_set!r} is not a Horovod process set; pass one "
                                 f"that hvd.add_process_set() returned, or leave it out (all workers)")
            if set_id == 0:
                self.process_set = None  # hvd.global_process_set: every worker, the default

    def non_default(self) -> Dict[str, Any]:
        """The options set to something other than Horovod's default."""
        default = HorovodOptions()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


def compression_name(value) -> str:
    """'none' or 'fp16', from Horovod's compressor classes or those names."""
    if value is None or value == "none":
        return "none"
    if value == "fp16":
        return "fp16"
    name = getattr(value, "__name__", "")
    if hasattr(value, "compress") and hasattr(value, "decompress"):
        if name == "NoneCompressor":
            return "none"
        if name == "FP16Compressor":
            return "fp16"
        raise ValueError(f"compression {name or value!r} is not one hvd_async knows; use "
                         f"hvd.Compression.none or hvd.Compression.fp16")
    raise ValueError(f"compression must be 'none', 'fp16' or a horovod Compression class "
                     f"(hvd.Compression.none / hvd.Compression.fp16), got {value!r}")


def op_name(value) -> str:
    """'average' or 'sum', from Horovod's op constants or those names; Adasum is refused."""
    if isinstance(value, str) and value.lower() in ("average", "sum"):
        return value.lower()
    if isinstance(value, int) and not isinstance(value, bool):
        from horovod.torch import Adasum, Average, Sum

        if value == Average:
            return "average"
        if value == Sum:
            return "sum"
        if value == Adasum:
            raise ValueError("op=hvd.Adasum is not supported by hvd_async (no algorithm here combines "
                             "gradients by Adasum); use horovod.torch.DistributedOptimizer for Adasum")
    raise ValueError(f"op must be 'average' or 'sum' (or hvd.Average / hvd.Sum), got {value!r}")


def check_supported(algorithm: str, supported: Iterable[str], options: HorovodOptions,
                    where: Mapping[str, Iterable[str]]) -> None:
    """Refuse (or, for speed-only options, warn about) a non-default option the algorithm gives no
    meaning to; ``where`` maps each option to the algorithms that support it."""
    for name, value in options.non_default().items():
        if name in supported:
            continue
        works = ", ".join(sorted(where.get(name, ()))) or "none"
        if name in SPEED_ONLY:
            warnings.warn(f"{name}={value!r} has no effect under {algorithm}: it groups allreduces, which "
                          f"only these algorithms make: {works}", stacklevel=user_stacklevel())
            continue
        raise ValueError(f"{name}={value!r} has no meaning under {algorithm}; it works with: {works} "
                         f"(leave it at Horovod's default here)")
