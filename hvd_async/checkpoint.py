"""Checkpoint files: the on-disk format, its atomic write, and the checks made when one is read back.

A checkpoint is one ``torch.save`` file holding a header and the caller's state::

    {"hvd_async_checkpoint": FORMAT_VERSION, "kind": "train", "created": <unix time>,
     "meta": {...}, "state": {...}}

``meta`` describes the job that wrote it (algorithm, world size, model, parameter shapes) so that
:func:`load` can refuse, in one line, to resume a different job. Files are read with
``torch.load(weights_only=True)``: no code from the file runs, so :func:`save` accepts only what
that loader can rebuild -- tensors, numbers, strings, bytes, None, ``torch.Size``/``dtype``/``device``
and dicts, lists, tuples and sets of those. Anything else (numpy arrays included) is refused before
a byte is written; convert it first (``torch.from_numpy(a)`` or ``a.tolist()``), so that what is
loaded is exactly what was saved.

Example::

    from hvd_async import checkpoint
    meta = {"algorithm": "asgd", "workers": 4}
    path = checkpoint.save_in("runs/ck", step, {"model": model.state_dict(),
                              "rng": checkpoint.rng_state()}, keep=2, meta=meta)
    state = checkpoint.load(checkpoint.latest("runs/ck"), expect=meta)
    checkpoint.set_rng_state(state["rng"])
"""
import glob
import os
import random
import re
import time
import zipfile
from collections import Counter, OrderedDict
from typing import Any, Dict, Optional

import numpy as np
import torch

from .checks import brief_error

FORMAT_VERSION = 1
_HEADER = "hvd_async_checkpoint"
_NAME = re.compile(r"^ckpt-(\d+)\.pt$")
_LEAVES = (torch.Tensor, torch.Size, torch.dtype, torch.device, str, bytes, bytearray, bool, int, float,
           complex, type(None))
_MAPPINGS = (dict, OrderedDict, Counter)
_SEQUENCES = (list, tuple, set)
_AGAIN = "use an older checkpoint or start without --resume"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or from another job; the message says what to do."""


# The layout of ``DistributedOptimizer.algorithm_state_dict()`` (the strategy's state and, on worker 0, the
# servers' shards), kept in it as "version" and raised when that layout changes so that an older reader
# would misread it. A state without the field was written before it existed: version 1.
ALGORITHM_STATE_VERSION = 1


def check_algorithm_state_version(state: Dict[str, Any]) -> None:
    """Refuse an algorithm state whose schema version this hvd_async does not read."""
    version = state.get("version", 1)
    if version != ALGORITHM_STATE_VERSION:
        raise CheckpointError(f"the algorithm state (opt.algorithm_state_dict(), a checkpoint's 'algorithm') has "
                              f"schema version {version!r}; this hvd_async reads version {ALGORITHM_STATE_VERSION}: "
                              f"load it with the hvd_async that wrote it")


def save(path: str, state: Dict[str, Any], *, kind: str = "train", meta: Optional[Dict[str, Any]] = None) -> None:
    """Write ``state`` to ``path`` atomically: a process killed at any moment leaves either the old
    file or the new one there, whole (plus at most a ``<path>.tmp-<pid>`` file, removed by the next save)."""
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint state must be a dict, got {type(state).__name__}")
    meta = dict(meta or {})
    _check_loadable(state, "state")
    _check_loadable(meta, "meta")
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    _remove_stray_tmp(path)
    record = {_HEADER: FORMAT_VERSION, "kind": str(kind), "created": time.time(), "meta": meta, "state": state}
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fd = os.open(directory, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str, *, expect: Optional[Dict[str, Any]] = None, kind: Optional[str] = None,
         map_location: Any = "cpu", mmap: bool = False) -> Dict[str, Any]:
    """Read the state saved at ``path``. Each key of ``expect`` must equal the same key of the
    checkpoint's ``meta`` (and ``kind``, if given, its kind); otherwise :class:`CheckpointError`
    names every difference. Tensors are mapped to ``map_location`` (the CPU unless told); with
    ``mmap`` their bytes stay in the file until read (a check of the header and meta alone reads
    little of a large checkpoint)."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path} does not exist; check the path or start without --resume")
    try:
        f = open(path, "rb")
    except OSError as error:
        raise CheckpointError(f"checkpoint {path} cannot be opened ({brief_error(error)}); "
                              f"check the path and its permissions, or {_AGAIN}") from None
    mmap = mmap and zipfile.is_zipfile(path)  # (torch maps only its zip format; other bytes get its own error)
    with f:
        try:
            record = torch.load(path if mmap else f, map_location=map_location, weights_only=True, mmap=mmap)
        except Exception as error:  # damaged bytes raise many types: pickle, zip, EOF, OSError, RuntimeError
            raise CheckpointError(f"checkpoint {path} is truncated, corrupt or not a torch file "
                                  f"({brief_error(error)}); {_AGAIN}") from None
    if not isinstance(record, dict) or _HEADER not in record:
        raise CheckpointError(f"{path} is a torch file but not a hvd_async checkpoint (no header); "
                              f"write checkpoints with hvd_async.checkpoint.save, or {_AGAIN}")
    if record[_HEADER] != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {record[_HEADER]!r}; this hvd_async "
                              f"reads version {FORMAT_VERSION}: use the hvd_async that wrote it, or {_AGAIN}")
    if kind is not None and record["kind"] != kind:
        raise CheckpointError(f"checkpoint {path} is a {record['kind']!r} checkpoint, expected {kind!r}; {_AGAIN}")
    expected = expect or {}
    differ = [key for key in expected if _plain(record["meta"].get(key, _Absent)) != _plain(expected[key])]
    if differ:
        had = ", ".join(_describe(key, record["meta"].get(key, _Absent), expected[key]) for key in differ)
        now = ", ".join(_describe(key, expected[key], record["meta"].get(key, _Absent)) for key in differ)
        raise CheckpointError(f"checkpoint {path} was written with {had}; this job runs with {now}: "
                              f"resume with the same settings or start without --resume")
    return record["state"]


def tensors_in(value):
    """The tensors in nested dicts/lists/tuples (the rules' and shards' state), depth first."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def tensors_copy(value):
    """A deep copy of nested dicts/lists holding tensors (the rules' and shards' state), tensors cloned."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: tensors_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(tensors_copy(v) for v in value)
    return value


def rng_state() -> Dict[str, Any]:
    """The states of Python's ``random``, numpy's global generator, torch's CPU generator and, when
    CUDA is in use, the current CUDA device's generator (one rank, one GPU)."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"] = {"key": numpy_state["state"]["key"].tolist(), "pos": int(numpy_state["state"]["pos"])}
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned, so the next draws repeat those that followed it."""
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise ValueError("set_rng_state expects the dict returned by rng_state() "
                         "(keys 'python', 'numpy', 'torch')")
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {"key": np.asarray(numpy_state["state"]["key"], dtype=np.uint32),
                            "pos": numpy_state["state"]["pos"]}
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def save_in(directory: str, step: int, state: Dict[str, Any], *, keep: int = 2, kind: str = "train",
            meta: Optional[Dict[str, Any]] = None) -> str:
    """Save ``state`` as ``<directory>/ckpt-<step>.pt``, then delete all but the ``keep`` newest
    checkpoints there (by step; the one just written is always kept). Returns its path."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1 (checkpoints kept), got {keep!r}")
    path = os.path.join(os.path.abspath(directory), f"ckpt-{step}.pt")
    save(path, state, kind=kind, meta=meta)
    older = [p for _, p in sorted(listed(directory), reverse=True) if p != path]
    for stale in older[keep - 1:]:
        os.remove(stale)
    return path


def latest(directory: str) -> Optional[str]:
    """Path of the ``ckpt-<step>.pt`` with the highest step in ``directory``; None if there is none."""
    found = listed(directory)
    return max(found)[1] if found else None


def listed(directory: str):
    """(step, path) of every ``ckpt-<step>.pt`` in ``directory`` (none if it does not exist)."""
    if not os.path.isdir(directory):
        return []
    directory = os.path.abspath(directory)
    return [(int(m.group(1)), os.path.join(directory, name))
            for name in os.listdir(directory) if (m := _NAME.match(name))]


def _remove_stray_tmp(path: str) -> None:
    """Remove temporary files left at ``path`` by saving processes that were killed (dead pids)."""
    for tmp in glob.glob(glob.escape(path) + ".tmp-*"):
        pid = tmp.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                os.remove(tmp)
            except FileNotFoundError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_loadable(value: Any, where: str) -> None:
    """Raise TypeError naming the first value under ``where`` that weights_only loading refuses."""
    if isinstance(value, _LEAVES):
        return
    if type(value) in _MAPPINGS:
        for key, item in value.items():
            _check_loadable(key, f"{where} key {key!r}")
            _check_loadable(item, f"{where}[{key!r}]")
        return
    if type(value) in _SEQUENCES:
        for index, item in enumerate(value):
            _check_loadable(item, f"{where}[{index}]")
        return
    hint = " (use torch.from_numpy(x) or x.tolist())" if type(value).__module__ == "numpy" else ""
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint "
                    f"cannot hold{hint}; use tensors, numbers, strings and dicts/lists/tuples of them")


class _Absent:
    """Stands for a meta key the checkpoint does not have."""


def _plain(value: Any) -> Any:
    """``value`` with tuples (``torch.Size`` included) as lists, so (3, 4) and [3, 4] compare equal."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _describe(key: str, value: Any, other: Any) -> str:
    """``key=value``; for dicts (parameter shapes) only the first entry that differs from ``other``."""
    if value is _Absent:
        return f"no {key}"
    if isinstance(value, dict) and isinstance(other, dict):
        for name in list(value) + [n for n in other if n not in value]:
            if _plain(value.get(name, _Absent)) != _plain(other.get(name, _Absent)):
                shown = "absent" if name not in value else _show(value[name])
                return f"{key}[{name!r}]={shown}"
    return f"{key}={_show(value)}"


def _show(value: Any) -> str:
    text = repr(_plain(value))
    return text if len(text) <= 80 else text[:77] + "..."
