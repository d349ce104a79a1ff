"""Load the training and test splits of the datasets the project trains on.

``load_dataset(name, data_dir)`` returns a :class:`DataSplits` whose ``train``
and ``test`` are map-style datasets yielding ``(float32 image tensor of shape
input_shape, int64 label)`` pairs.

* ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real images,
  nothing to download); the project's default. Always (1, 8, 8): ``image_size``
  and ``data_dir`` are ignored.
* ``synthetic``: generated from ``seed``; one random prototype image per class
  plus Gaussian noise, so a small model learns it in a few epochs.
* ``mnist``, ``cifar10``, ``imagenet``: read from ``data_dir`` with torchvision,
  never downloaded.

Every failure (unknown name, missing or malformed files, bad sizes) raises
:class:`DataError` with one line that says what was wrong and what to do.
"""
import os
import pickle
from typing import List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, TensorDataset
from torchvision import transforms
from torchvision.datasets import CIFAR10, MNIST, ImageFolder
from torchvision.datasets.mnist import read_image_file, read_label_file

from .checks import is_int_at_least

DATASETS = ("digits", "synthetic", "mnist", "cifar10", "imagenet")

NUM_SYNTHETIC_CLASSES = 10
# Per-pixel noise around each class prototype (prototype pixels are N(0, 1)).
# A single pixel tells little about the class; a model that pools many pixels
# learns the classes within a few epochs.
SYNTHETIC_NOISE = 3.0

MNIST_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_NEEDS = {  # what each dataset read from files needs in --data-dir
    "mnist": "a folder with the MNIST files (train-images-idx3-ubyte, ...)",
    "cifar10": f"a folder holding {CIFAR10_FOLDER}/ (data_batch_1, ..., test_batch, batches.meta)",
    "imagenet": "an ImageNet-style folder with train/<class>/ and val/<class>/ image folders",
}
FILE_DATASETS = tuple(_NEEDS)


class DataError(ValueError):
    """Bad dataset name or a data directory that is missing or malformed; the message says what to do."""


class DataSplits(NamedTuple):
    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: Tuple[int, int, int]  # (channels, height, width) of one sample


class _FolderMNIST(MNIST):
    """MNIST read from the idx files in ``root`` itself (torchvision looks in root/MNIST/raw)."""

    @property
    def raw_folder(self) -> str:
        return self.root


class _FolderCIFAR10(CIFAR10):
    """CIFAR-10 read from the batch files in ``root`` itself, without md5 checks."""

    base_folder = ""

    # torchvision compares each file's md5 with the official release's, so any
    # other copy (e.g. the small files that tests write) is refused; checking
    # that the files exist is enough here, and malformed files are caught and
    # reported when they are read.
    def _check_integrity(self) -> bool:
        return not _missing(self.root, CIFAR10_FILES)

    def _load_meta(self) -> None:  # the same as torchvision's, less the md5 check
        with open(os.path.join(self.root, self.meta["filename"]), "rb") as infile:
            self.classes = pickle.load(infile, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


def _load_rgb(path: str) -> Image.Image:
    """ImageFolder's loader, failing with a DataError that names an unreadable image."""
    try:
        with open(path, "rb") as infile:
            return Image.open(infile).convert("RGB")
    except OSError as error:
        raise DataError(f"{path} is not a readable image ({_brief(error)}); remove or replace it") from None


def load_dataset(name: str, data_dir: Optional[str] = None, *, seed: int = 0,
                 image_size: Optional[int] = None, synthetic_samples: int = 2048) -> DataSplits:
    """Load dataset ``name``; see the module docstring for what each one needs."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if image_size is not None and not is_int_at_least(image_size, 1):
        raise DataError(f"image_size must be a positive integer, got {image_size!r}")
    if name == "digits":
        return _digits(seed)
    if name == "synthetic":
        if not is_int_at_least(synthetic_samples, 4):
            raise DataError(f"synthetic_samples must be an integer of at least 4 "
                            f"(a quarter of it makes the test split), got {synthetic_samples!r}")
        return _synthetic(seed, image_size or 32, synthetic_samples)
    if data_dir is None:
        raise DataError(f"dataset {name!r} needs --data-dir pointing at {_NEEDS[name]}; "
                        f"digits and synthetic need no files")
    data_dir = os.path.abspath(os.path.expanduser(str(data_dir)))
    if not os.path.isdir(data_dir):
        raise DataError(f"data directory {data_dir} does not exist or is not a folder; "
                        f"point --data-dir at {_NEEDS[name]}")
    loader = {"mnist": _mnist, "cifar10": _cifar10, "imagenet": _imagenet}[name]
    return loader(data_dir, image_size)


def _digits(seed: int) -> DataSplits:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.2, random_state=seed, stratify=digits.target)
    mean, std = x_train.mean(), x_train.std()

    def tensors(x, y):
        images = torch.as_tensor((x - mean) / std, dtype=torch.float32).reshape(-1, 1, 8, 8)
        return TensorDataset(images, torch.as_tensor(y, dtype=torch.int64))

    return DataSplits(tensors(x_train, y_train), tensors(x_test, y_test), 10, (1, 8, 8))


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


def _image_transform(image_size: Optional[int], mean, std, crop: bool = False):
    steps = []
    if image_size is not None:
        steps.append(transforms.Resize(image_size) if crop else transforms.Resize((image_size, image_size)))
        if crop:
            steps.append(transforms.CenterCrop(image_size))
    steps += [transforms.ToTensor(), transforms.Normalize(mean, std)]
    return transforms.Compose(steps)


def _missing(folder: str, names) -> List[str]:
    return [n for n in names if not os.path.isfile(os.path.join(folder, n))]


def _mnist(data_dir: str, image_size: Optional[int]) -> DataSplits:
    needed = MNIST_FILES[True] + MNIST_FILES[False]
    candidates = [os.path.join(data_dir, "MNIST", "raw"), os.path.join(data_dir, "raw"), data_dir]
    folder = next((c for c in candidates if not _missing(c, needed)), None)
    if folder is None:
        searched = next((c for c in candidates if os.path.isdir(c) and len(_missing(c, needed)) < 4),
                        data_dir)
        raise DataError(f"MNIST files missing in {searched}: {', '.join(_missing(searched, needed))}; "
                        f"put the uncompressed idx files there or in {data_dir}/MNIST/raw")

    transform = _image_transform(image_size, MNIST_MEAN, MNIST_STD)
    splits = []
    for train in (True, False):
        try:
            dataset = _FolderMNIST(folder, train=train, download=False, transform=transform)
        except Exception as error:  # torchvision raises assorted errors on bad idx files
            bad = _find_bad_file(folder, MNIST_FILES[train], (read_image_file, read_label_file))
            raise DataError(f"{bad or folder} is not a valid MNIST idx file ({_brief(error)}); "
                            f"replace it with the original uncompressed file") from None
        if len(dataset.data) != len(dataset.targets):
            images, labels = MNIST_FILES[train]
            raise DataError(f"{os.path.join(folder, images)} has {len(dataset.data)} images but "
                            f"{os.path.join(folder, labels)} has {len(dataset.targets)} labels; "
                            f"the MNIST files do not belong together")
        splits.append(dataset)
    return DataSplits(splits[0], splits[1], 10, (1,) + (image_size or 28,) * 2)


def _find_bad_file(folder: str, names, readers) -> Optional[str]:
    """Return the path of the first file that its reader rejects, or None."""
    for name, read in zip(names, readers):
        path = os.path.join(folder, name)
        try:
            read(path)
        except Exception:
            return path
    return None


def _brief(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text and text[0] else type(error).__name__


def _cifar10(data_dir: str, image_size: Optional[int]) -> DataSplits:
    nested = os.path.join(data_dir, CIFAR10_FOLDER)
    folder = nested if os.path.isdir(nested) else data_dir
    missing = _missing(folder, CIFAR10_FILES)
    if missing:
        raise DataError(f"CIFAR-10 files missing in {folder}: {', '.join(missing)}; "
                        f"extract cifar-10-python.tar.gz so that {nested} holds them")

    transform = _image_transform(image_size, CIFAR10_MEAN, CIFAR10_STD)
    splits = []
    for train in (True, False):
        try:
            dataset = _FolderCIFAR10(folder, train=train, download=False, transform=transform)
        except Exception as error:  # unpickling errors, missing keys, wrong array sizes
            bad = _find_bad_cifar_file(folder, train)
            raise DataError(f"{bad or folder} is not a valid CIFAR-10 file ({_brief(error)}); "
                            f"replace it with the file from cifar-10-python.tar.gz") from None
        if len(dataset.data) != len(dataset.targets):
            raise DataError(f"CIFAR-10 batches in {folder} hold {len(dataset.data)} images but "
                            f"{len(dataset.targets)} labels; replace them with the original files")
        splits.append(dataset)
    return DataSplits(splits[0], splits[1], len(splits[0].classes), (3,) + (image_size or 32,) * 2)


def _find_bad_cifar_file(folder: str, train: bool) -> Optional[str]:
    """Return the path of the first CIFAR-10 file of a split that cannot be used, or None."""
    batches = CIFAR10_FILES[:5] if train else CIFAR10_FILES[5:6]
    for name in batches + ("batches.meta",):
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as infile:
                entry = pickle.load(infile, encoding="latin1")
            if name == "batches.meta":
                entry["label_names"]
            else:
                np.asarray(entry["data"]).reshape(-1, 3, 32, 32)
                entry["labels"] if "labels" in entry else entry["fine_labels"]
        except Exception:
            return path
    return None


def _imagenet(data_dir: str, image_size: Optional[int]) -> DataSplits:
    classes = {}
    for split in ("train", "val"):
        folder = os.path.join(data_dir, split)
        if not os.path.isdir(folder):
            raise DataError(f"ImageNet folder {folder} is missing; {data_dir} needs "
                            f"train/<class>/ and val/<class>/ image folders")
        classes[split] = sorted(e.name for e in os.scandir(folder) if e.is_dir())
        if not classes[split]:
            raise DataError(f"{folder} has no class folders; put the images in {folder}/<class>/")
    if classes["train"] != classes["val"]:
        only_train = sorted(set(classes["train"]) - set(classes["val"]))
        only_val = sorted(set(classes["val"]) - set(classes["train"]))
        raise DataError(f"class folders of {data_dir}/train and {data_dir}/val differ "
                        f"(only in train: {', '.join(only_train) or 'none'}; only in val: "
                        f"{', '.join(only_val) or 'none'}); give val/ the same class folders")

    size = image_size or 224
    transform = _image_transform(size, IMAGENET_MEAN, IMAGENET_STD, crop=True)
    splits = []
    for split in ("train", "val"):
        folder = os.path.join(data_dir, split)
        try:
            splits.append(ImageFolder(folder, transform=transform, loader=_load_rgb))
        except FileNotFoundError as error:  # a class folder without any image file
            raise DataError(f"no images found under {folder} ({_brief(error)}); "
                            f"every class folder needs image files (.JPEG, .png, ...)") from None
    return DataSplits(splits[0], splits[1], len(classes["train"]), (3, size, size))
