"""Writers of small files in the real formats of MNIST (idx), CIFAR-10 (pickled batches) and ImageNet folders."""
import os
import pickle
import struct

import numpy as np
from PIL import Image


def write_idx(path, array, magic):
    """Write ``array`` (uint8) in the big-endian idx format that MNIST ships in."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as out:
        out.write(struct.pack(">i", magic))
        out.write(struct.pack(f">{array.ndim}i", *array.shape))
        out.write(array.tobytes())


def write_mnist(folder, n_train=20, n_test=10, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    os.makedirs(folder, exist_ok=True)
    for name, array in arrays.items():
        write_idx(os.path.join(folder, name), array, 2051 if "images" in name else 2049)
    return arrays


def write_cifar(root, per_batch=4, n_test=3, seed=0):
    """Write the cifar-10-batches-py layout; keys are str, as the real (Python 2)
    pickles give when unpickled with encoding='latin1' as torchvision does."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    batches = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "labels": [int(v) for v in rng.integers(0, 10, n)]}
        with open(os.path.join(folder, name), "wb") as out:
            pickle.dump(batch, out)
        batches[name] = batch
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(os.path.join(folder, "batches.meta"), "wb") as out:
        pickle.dump({"label_names": names, "num_cases_per_batch": per_batch}, out)
    return folder, batches


COLOURS = {"cat": (200, 10, 10), "dog": (10, 200, 10), "fish": (10, 10, 200)}


def write_imagenet(root, classes=COLOURS, train_per_class=2, val_per_class=1):
    """Solid-colour PNGs of varied sizes in train/<class>/ and val/<class>/."""
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for cls in classes:
            folder = os.path.join(root, split, cls)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                Image.new("RGB", (40 + 8 * i, 36), COLOURS.get(cls, (0, 0, 0))).save(
                    os.path.join(folder, f"{cls}_{i}.png"))
