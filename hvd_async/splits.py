"""What every dataset loader returns and raises, and the cache folder where the loaders keep what they
derive once (:mod:`hvd_async.data` and the image-file readers of :mod:`hvd_async.image_files`, which
both import it: neither imports the other's names)."""
import os
from typing import NamedTuple, Tuple

from torch.utils.data import Dataset

CIFAR10_FOLDER = "cifar-10-batches-py"


def cache_dir(*parts: str) -> str:
    """A folder under the project's cache (``$HVD_ASYNC_CACHE``, else ``~/.cache/hvd_async``), made if
    missing: where the loaders keep what they derived from the data once."""
    folder = os.path.join(os.environ.get("HVD_ASYNC_CACHE") or os.path.expanduser("~/.cache/hvd_async"), *parts)
    os.makedirs(folder, exist_ok=True)
    return folder


class DataError(ValueError):
    """Bad dataset name or a data directory that is missing or malformed; the message says what to do."""


class DataSplits(NamedTuple):
    """The training and the scored split (``test``: the test split, or after
    ``for_evaluation(..., "val")`` the validation split)."""
    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: Tuple[int, int, int]  # (channels, height, width) of one sample
