"""Read the datasets that live in files (MNIST, Fashion-MNIST, CIFAR-10, ImageNet-style folders) with torchvision.

Only :func:`hvd_async.data.load_dataset` imports this module, and only for those datasets, so a job
on digits or synthetic data never loads torchvision (about a second of every rank's start)."""
import hashlib
import os
import pickle
import shutil
import tempfile
from typing import List, Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import TensorDataset
from torchvision import transforms
from torchvision.transforms import functional
from torchvision.datasets import CIFAR10, MNIST, ImageFolder
from torchvision.datasets.mnist import read_image_file, read_label_file
from torchvision.datasets.utils import extract_archive

from .checks import brief_error
from .splits import CIFAR10_FOLDER, DataError, DataSplits, cache_dir

MNIST_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)  # of its 60,000 training images
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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
        raise DataError(f"{path} is not a readable image ({brief_error(error)}); remove or replace it") from None


def load(name: str, data_dir: str, image_size: Optional[int]) -> DataSplits:
    """Load ``name`` (mnist, cifar10 or imagenet) from the folder ``data_dir``, which exists."""
    return {"mnist": _mnist, "cifar10": _cifar10, "imagenet": _imagenet}[name](data_dir, image_size)


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


def fashion_mnist(folder: str, image_size: Optional[int]) -> DataSplits:
    """Fashion-MNIST from ``folder``: MNIST's four idx files, uncompressed or gzipped (as Debian ships
    them: those are uncompressed once into the cache, ``$HVD_ASYNC_CACHE/fashion-mnist/``)."""
    gzipped = [name + ".gz" for name in MNIST_FILES[True] + MNIST_FILES[False]]
    if _missing(folder, MNIST_FILES[True] + MNIST_FILES[False]) and not _missing(folder, gzipped):
        folder = _uncompressed(folder, gzipped)
    splits = _mnist(folder, image_size, FASHION_MNIST_MEAN, FASHION_MNIST_STD, "Fashion-MNIST")
    if image_size is not None:
        return splits
    # At 28x28 the whole split goes through ToTensor's scaling and Normalize at once: each image
    # through PIL would cost about as much as the model's step on it (at the price of the split held
    # as float32 in every rank's memory).
    return splits._replace(train=_normalized(splits.train, FASHION_MNIST_MEAN, FASHION_MNIST_STD),
                           test=_normalized(splits.test, FASHION_MNIST_MEAN, FASHION_MNIST_STD))


def _normalized(dataset: MNIST, mean, std) -> TensorDataset:
    """``dataset``'s images as its transform (ToTensor, Normalize) makes them, all at once."""
    images = functional.convert_image_dtype(dataset.data.unsqueeze(1), torch.float32)  # ToTensor's /255
    return TensorDataset(functional.normalize(images, mean, std, inplace=True), dataset.targets)


def _uncompressed(folder: str, gzipped: List[str]) -> str:
    """A cache folder holding ``folder``'s gzipped files uncompressed (each file written whole and then
    renamed, so that ranks uncompressing at once never read half a file)."""
    cache = cache_dir("fashion-mnist", hashlib.sha256(os.path.abspath(folder).encode()).hexdigest()[:12])
    stale = [name for name in gzipped if not os.path.isfile(os.path.join(cache, name[:-3])) or
             os.path.getmtime(os.path.join(cache, name[:-3])) < os.path.getmtime(os.path.join(folder, name))]
    if stale:
        scratch = tempfile.mkdtemp(dir=cache)
        try:
            for name in stale:
                extract_archive(os.path.join(folder, name), scratch)
                os.replace(os.path.join(scratch, name[:-3]), os.path.join(cache, name[:-3]))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return cache


def _mnist(data_dir: str, image_size: Optional[int], mean=MNIST_MEAN, std=MNIST_STD,
           what: str = "MNIST") -> DataSplits:
    needed = MNIST_FILES[True] + MNIST_FILES[False]
    candidates = [os.path.join(data_dir, "MNIST", "raw"), os.path.join(data_dir, "raw"), data_dir]
    folder = next((c for c in candidates if not _missing(c, needed)), None)
    if folder is None:
        searched = next((c for c in candidates if os.path.isdir(c) and len(_missing(c, needed)) < 4),
                        data_dir)
        raise DataError(f"{what} files missing in {searched}: {', '.join(_missing(searched, needed))}; "
                        f"put the uncompressed idx files there or in {data_dir}/MNIST/raw")

    transform = _image_transform(image_size, mean, std)
    splits = []
    for train in (True, False):
        try:
            dataset = _FolderMNIST(folder, train=train, download=False, transform=transform)
        except Exception as error:  # torchvision raises assorted errors on bad idx files
            bad = _find_bad_file(folder, MNIST_FILES[train], (read_image_file, read_label_file))
            raise DataError(f"{bad or folder} is not a valid {what} idx file ({brief_error(error)}); "
                            f"replace it with the original uncompressed file") from None
        if len(dataset.data) != len(dataset.targets):
            images, labels = MNIST_FILES[train]
            raise DataError(f"{os.path.join(folder, images)} has {len(dataset.data)} images but "
                            f"{os.path.join(folder, labels)} has {len(dataset.targets)} labels; "
                            f"the {what} files do not belong together")
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
            raise DataError(f"{bad or folder} is not a valid CIFAR-10 file ({brief_error(error)}); "
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
            raise DataError(f"no images found under {folder} ({brief_error(error)}); "
                            f"every class folder needs image files (.JPEG, .png, ...)") from None
    return DataSplits(splits[0], splits[1], len(classes["train"]), (3, size, size))
