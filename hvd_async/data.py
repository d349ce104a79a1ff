"""Load the training and test splits of the datasets the project trains on.

``load_dataset(name, data_dir)`` returns a :class:`DataSplits` whose ``train``
and ``test`` are map-style datasets yielding ``(float32 image tensor of shape
input_shape, int64 label)`` pairs.

* ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real images,
  nothing to download); the project's default. Always (1, 8, 8): ``image_size``
  and ``data_dir`` are ignored. The train/test split is fixed (``DIGITS_SPLIT_SEED``),
  the same for every run seed.
* ``fashion-mnist``: Zalando's Fashion-MNIST (60,000 training and 10,000 test
  28x28 images of clothes, 10 classes), read from Debian's package
  ``dataset-fashion-mnist`` (``FASHION_MNIST_DIR``; ``data_dir``, when given,
  is read instead).
* ``synthetic``: generated from ``seed``; one random prototype image per class
  plus Gaussian noise, so a small model learns it in a few epochs.
* ``teacher``: 24,000 training and 4,000 test 16x16 Gaussian images, labelled by
  a fixed random two-layer network (the same task for every seed; ``seed``
  draws the images). Large enough that many workers still make many pushes an
  epoch, and hard enough that a small model stays well below 100%.
* ``mnist``, ``cifar10``, ``imagenet``: read from ``data_dir`` with torchvision,
  never downloaded.

:func:`for_evaluation` picks what a job trains on and scores: the training split
and the test split (``"test"``, for final tables), or the training split less
a validation split carved from it once (:func:`validation_split`: fixed indices,
the same for every run seed; the run seed changes initialisation and order,
never the split) and that validation split (``"val"``, for every choice of a
default or a hyperparameter).

Every failure (unknown name, missing or malformed files, bad sizes) raises
:class:`DataError` with one line that says what was wrong and what to do.
"""
import os
import tempfile
import zipfile
from typing import Optional, Sized, Tuple, cast

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from .checks import is_int_at_least
from .splits import CIFAR10_FOLDER, DataError, DataSplits, cache_dir  # noqa: F401  (this module's names too)

DATASETS = ("digits", "fashion-mnist", "synthetic", "teacher", "mnist", "cifar10", "imagenet")
EVAL_SPLITS = ("test", "val")  # what a job scores (for_evaluation)

# The fixed splits: seeds of their own, never the run's.
DIGITS_SPLIT_SEED = 0  # digits' train/test split (the one run seed 0 always had)
VALIDATION_SEED = 4747  # which training images make the validation split
VALIDATION_FRACTION = 0.2  # of the training split, where VALIDATION_SIZE names no size
VALIDATION_SIZE = {"fashion-mnist": 5000}

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # where Debian's package puts the idx files
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"

NUM_SYNTHETIC_CLASSES = 10
# Per-pixel noise around each class prototype (prototype pixels are N(0, 1)).
# A single pixel tells little about the class; a model that pools many pixels
# learns the classes within a few epochs.
SYNTHETIC_NOISE = 3.0

# The teacher task: images of TEACHER_SIDE x TEACHER_SIDE N(0, 1) pixels (stored x TEACHER_SCALE, so
# that lr 0.1 with momentum suits it as it suits digits), the class the argmax of a random
# tanh network with TEACHER_HIDDEN units (weights from TEACHER_SEED, class scores centred so that no
# class is rare). A 128-unit MLP reaches about 0.75 test accuracy in 5 epochs.
TEACHER_SIDE, TEACHER_HIDDEN, TEACHER_SEED, TEACHER_SCALE = 16, 32, 20, 0.25
TEACHER_TRAIN, TEACHER_TEST = 24_000, 4_000

_NEEDS = {  # what each dataset read from files needs in --data-dir
    "mnist": "a folder with the MNIST files (train-images-idx3-ubyte, ...)",
    "cifar10": f"a folder holding {CIFAR10_FOLDER}/ (data_batch_1, ..., test_batch, batches.meta)",
    "imagenet": "an ImageNet-style folder with train/<class>/ and val/<class>/ image folders",
}
FILE_DATASETS = tuple(_NEEDS)


def load_dataset(name: str, data_dir: Optional[str] = None, *, seed: int = 0,
                 image_size: Optional[int] = None, synthetic_samples: int = 2048) -> DataSplits:
    """Load dataset ``name``; see the module docstring for what each one needs."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if image_size is not None and not is_int_at_least(image_size, 1):
        raise DataError(f"image_size must be a positive integer, got {image_size!r}")
    if name == "digits":
        return _digits()
    if name == "teacher":
        return _teacher(seed)
    if name == "fashion-mnist":
        from . import image_files  # torchvision: only jobs that read image files load it
        return image_files.fashion_mnist(fashion_mnist_dir(data_dir), image_size)
    if name == "synthetic":
        if not is_int_at_least(synthetic_samples, 4):
            raise DataError(f"synthetic_samples must be an integer of at least 4 "
                            f"(a quarter of it makes the test split), got {synthetic_samples!r}")
        return _synthetic(seed, image_size or 32, synthetic_samples)
    if data_dir is None:
        raise DataError(f"dataset {name!r} needs --data-dir pointing at {_NEEDS[name]}; "
                        f"digits, synthetic and teacher need no files")
    data_dir = os.path.abspath(os.path.expanduser(str(data_dir)))
    if not os.path.isdir(data_dir):
        raise DataError(f"data directory {data_dir} does not exist or is not a folder; "
                        f"point --data-dir at {_NEEDS[name]}")
    from . import image_files  # torchvision: only jobs that read image files load it
    return image_files.load(name, data_dir, image_size)


def fashion_mnist_dir(data_dir: Optional[str] = None) -> str:
    """The folder of Fashion-MNIST's idx files (``data_dir`` where given); DataError where Debian's
    package is not installed."""
    if data_dir is not None:
        return os.path.abspath(os.path.expanduser(str(data_dir)))
    if not os.path.isdir(FASHION_MNIST_DIR):
        raise DataError(f"dataset fashion-mnist needs Debian's package {FASHION_MNIST_PACKAGE} (files in "
                        f"{FASHION_MNIST_DIR}): sudo apt-get install {FASHION_MNIST_PACKAGE}")
    return FASHION_MNIST_DIR


def validation_split(train: Dataset, size: int) -> Tuple[Subset, Subset]:
    """``(rest, validation)``: ``size`` images of ``train`` drawn once by ``VALIDATION_SEED`` (the
    same indices for every run seed), and the others, both in their order in ``train``."""
    total = len(cast(Sized, train))  # (torch's Dataset declares no len(); these datasets have one)
    if not 0 < size < total:
        raise DataError(f"a validation split of {size} images needs a training split of more, "
                        f"got {total}")
    order = torch.randperm(total, generator=torch.Generator().manual_seed(VALIDATION_SEED))
    val = order[:size].sort().values.tolist()
    rest = order[size:].sort().values.tolist()
    return Subset(train, rest), Subset(train, val)


def validation_size(name: str, train_size: int) -> int:
    """How many training images of dataset ``name`` make its validation split."""
    return VALIDATION_SIZE.get(name, max(1, round(VALIDATION_FRACTION * train_size)))


def for_evaluation(splits: DataSplits, name: str, on: str) -> DataSplits:
    """What a job trains on and scores: ``on="test"``, the splits as loaded (the whole training split;
    for final tables); ``on="val"``, the training split less its validation split, scored on the
    validation split (for choosing defaults and hyperparameters; the test split stays unseen).

    Example::

        >>> splits = for_evaluation(load_dataset("digits"), "digits", "val")
        >>> len(splits.train), len(splits.test)
        (1150, 287)
    """
    if on not in EVAL_SPLITS:
        raise DataError(f"unknown split to score {on!r}; choose one of: {', '.join(EVAL_SPLITS)}")
    if on == "test":
        return splits
    rest, val = validation_split(splits.train, validation_size(name, len(cast(Sized, splits.train))))
    return splits._replace(train=rest, test=val)


def load_dataset_on(comm, name: str, data_dir: Optional[str] = None, *, seed: int = 0,
                    image_size: Optional[int] = None) -> DataSplits:
    """:func:`load_dataset` on every rank of the communicator ``comm`` (an mpi4py one). digits is read
    on rank 0 and broadcast (a small tensor, where each rank would otherwise import scikit-learn, slow
    to import); the others are made (synthetic) or opened (the files) on every rank. A
    DataError is raised on every rank alike."""
    if name != "digits" or comm.size == 1:
        return load_dataset(name, data_dir, seed=seed, image_size=image_size)
    splits, error = None, None
    if comm.rank == 0:
        try:
            splits = load_dataset(name, data_dir, seed=seed, image_size=image_size)
        except DataError as exc:
            error = exc
    splits, error = comm.bcast((splits, error), root=0)
    if error is not None:
        raise error
    return splits


def _digits() -> DataSplits:
    x_train, x_test, y_train, y_test = _digits_split()
    mean, std = x_train.mean(), x_train.std()

    def tensors(x, y):
        images = torch.as_tensor((x - mean) / std, dtype=torch.float32).reshape(-1, 1, 8, 8)
        return TensorDataset(images, torch.as_tensor(y, dtype=torch.int64))

    return DataSplits(tensors(x_train, y_train), tensors(x_test, y_test), 10, (1, 8, 8))


def _digits_split():
    """``(x_train, x_test, y_train, y_test)``: scikit-learn's digits scaled to [0, 1] and split by
    ``train_test_split`` (stratified, ``DIGITS_SPLIT_SEED``). The arrays are kept in the cache, named
    by scikit-learn's version, after the first draw: importing scikit-learn costs each job about a
    second of its start (on rank 0, the others waiting), reading the file a few milliseconds. A file
    that cannot be read is drawn again; a cache that cannot be written costs only that second."""
    from importlib import metadata

    names, path = ("x_train", "x_test", "y_train", "y_test"), None
    try:
        path = os.path.join(cache_dir("digits"),
                            f"split-{DIGITS_SPLIT_SEED}-scikit-learn-{metadata.version('scikit-learn')}.npz")
        with np.load(path) as saved:
            return tuple(saved[name] for name in names)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, metadata.PackageNotFoundError):
        pass  # not drawn yet here, or unreadable
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    arrays = tuple(train_test_split(digits.data / 16.0, digits.target, test_size=0.2,
                                    random_state=DIGITS_SPLIT_SEED, stratify=digits.target))
    if path is not None:
        _save_whole(path, dict(zip(names, arrays)))
    return arrays


def _save_whole(path: str, arrays) -> None:
    """``arrays`` saved to ``path`` (npz) whole or not at all: written beside it and renamed, so that
    jobs drawing at once never read half a file; where the folder refuses the write, nothing."""
    try:
        handle, scratch = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz")
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **arrays)
        os.replace(scratch, path)
    except OSError:
        os.unlink(scratch)


def _synthetic(seed: int, size: int, samples: int) -> DataSplits:
    generator = torch.Generator().manual_seed(seed)
    shape = (3, size, size)
    prototypes = torch.randn((NUM_SYNTHETIC_CLASSES,) + shape, generator=generator)
    scale = (1.0 + SYNTHETIC_NOISE ** 2) ** -0.5  # keeps pixels at unit variance

    def draw(count: int) -> TensorDataset:
        labels = torch.arange(count) % NUM_SYNTHETIC_CLASSES
        labels = labels[torch.randperm(count, generator=generator)]
        noise = torch.randn((count,) + shape, generator=generator)
        images = (prototypes[labels] + SYNTHETIC_NOISE * noise) * scale
        return TensorDataset(images, labels)

    return DataSplits(draw(samples), draw(samples // 4), NUM_SYNTHETIC_CLASSES, shape)


def _teacher(seed: int) -> DataSplits:
    inputs = TEACHER_SIDE * TEACHER_SIDE
    task = torch.Generator().manual_seed(TEACHER_SEED)
    w1 = torch.randn(inputs, TEACHER_HIDDEN, generator=task) / inputs ** 0.5
    w2 = torch.randn(TEACHER_HIDDEN, NUM_SYNTHETIC_CLASSES, generator=task) / TEACHER_HIDDEN ** 0.5

    def scores(x):
        return torch.tanh(x.flatten(1) @ w1) @ w2

    centre = scores(torch.randn(8192, inputs, generator=task)).mean(0)
    draw_gen = torch.Generator().manual_seed(seed)

    def draw(count: int) -> TensorDataset:
        x = torch.randn(count, 1, TEACHER_SIDE, TEACHER_SIDE, generator=draw_gen)
        return TensorDataset(x * TEACHER_SCALE, (scores(x) - centre).argmax(1))

    return DataSplits(draw(TEACHER_TRAIN), draw(TEACHER_TEST), NUM_SYNTHETIC_CLASSES, (1, TEACHER_SIDE, TEACHER_SIDE))
