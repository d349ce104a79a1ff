"""Tests for hvd_async.data: every dataset is read back from small files the tests write."""
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from datafiles import COLOURS, write_cifar, write_idx, write_imagenet, write_mnist
from hvd_async.data import DATASETS, DataError, DataSplits, load_dataset, load_dataset_on

MNIST_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ---------------------------------------------------------------- what a rank loads

def test_a_rank_starts_without_torchvision_or_scikit_learn():
    """Every rank of every job imports the job's modules: torchvision (the file datasets, the ResNets)
    and scikit-learn (digits, read on one rank) cost about a second of CPU each, so they stay out."""
    code = ("import sys, hvd_async.job.train, hvd_async.job.job_process, hvd_async.models; "
            "print(sorted(m for m in ('torchvision', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


class _Comm:
    """The part of an mpi4py communicator load_dataset_on uses, for one of ``size`` ranks."""

    def __init__(self, rank, size, sent=None):
        self.rank, self.size, self.sent = rank, size, sent

    def bcast(self, obj, root=0):
        return obj if self.rank == root else self.sent


def test_digits_is_read_on_one_rank_and_sent_to_the_others():
    sent = load_dataset_on(_Comm(0, 3), "digits", seed=4)  # rank 0 reads
    assert torch.equal(sent.train.tensors[0], load_dataset("digits", seed=4).train.tensors[0])
    splits = load_dataset_on(_Comm(2, 3, sent=(sent, None)), "digits", seed=4)
    assert splits is sent  # rank 2 read nothing: it took what rank 0 broadcast
    with pytest.raises(DataError, match="bad things"):
        load_dataset_on(_Comm(1, 3, sent=(None, DataError("bad things"))), "digits")


# ---------------------------------------------------------------- digits

def test_digits_sizes_shapes_and_classes():
    splits = load_dataset("digits")
    assert isinstance(splits, DataSplits)
    assert len(splits.train) + len(splits.test) == 1797
    assert len(splits.test) == 360  # 20 % of 1797, rounded up by scikit-learn
    assert splits.num_classes == 10 and splits.input_shape == (1, 8, 8)
    image, label = splits.train[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32
    assert torch.as_tensor(label).dtype == torch.int64
    labels = splits.train.tensors[1]
    assert sorted(labels.unique().tolist()) == list(range(10))


def test_digits_split_is_the_same_for_every_seed():
    """The run seed changes initialisation and order, never the split (DIGITS_SPLIT_SEED; 0, the split
    run seed 0 always had)."""
    a, b, c = load_dataset("digits", seed=3), load_dataset("digits", seed=3), load_dataset("digits", seed=4)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert torch.equal(a.test.tensors[1], b.test.tensors[1])
    assert torch.equal(a.test.tensors[0], c.test.tensors[0])


def test_digits_split_read_from_the_cache_is_the_one_scikit_learn_draws(tmp_path, monkeypatch):
    """The first job draws the split and keeps it; later ones read it without scikit-learn, bit for
    bit the same; a damaged file is drawn again and replaced."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.data / 16.0, digits.target, test_size=0.2,
                                                        random_state=0, stratify=digits.target)
    mean, std = x_train.mean(), x_train.std()
    drawn = torch.as_tensor((x_test - mean) / std, dtype=torch.float32).reshape(-1, 1, 8, 8)
    monkeypatch.setenv("HVD_ASYNC_CACHE", str(tmp_path))

    first = load_dataset("digits")
    (kept,) = (tmp_path / "digits").glob("split-0-scikit-learn-*.npz")
    with monkeypatch.context() as blocked:  # a job that reads the file imports no scikit-learn
        for name in ("sklearn", "sklearn.datasets", "sklearn.model_selection"):
            blocked.setitem(sys.modules, name, None)
        cached = load_dataset("digits")
    for splits in (first, cached):
        assert torch.equal(splits.test.tensors[0], drawn)
        assert torch.equal(splits.test.tensors[1], torch.as_tensor(y_test))
        assert torch.equal(splits.train.tensors[1], torch.as_tensor(y_train))
    assert torch.equal(first.train.tensors[0], cached.train.tensors[0])

    kept.write_bytes(b"not an npz file")
    assert torch.equal(load_dataset("digits").test.tensors[0], drawn)
    assert np.load(kept)["x_test"].shape == (360, 64)  # replaced whole
    assert [p.name for p in (tmp_path / "digits").iterdir()] == [kept.name]  # no scratch left


def test_digits_standardised_with_train_statistics():
    splits = load_dataset("digits", data_dir="/ignored/for/digits")
    train = splits.train.tensors[0]
    assert abs(train.mean().item()) < 1e-5
    assert abs(train.std(unbiased=False).item() - 1.0) < 1e-4
    # The test split uses the train statistics, so it is close to, not exactly, standard.
    assert abs(splits.test.tensors[0].mean().item()) < 0.1


def test_digits_stratified_split_keeps_class_balance():
    test_labels = load_dataset("digits").test.tensors[1]
    counts = torch.bincount(test_labels, minlength=10)
    assert counts.min().item() >= 34 and counts.max().item() <= 38


# ---------------------------------------------------------------- synthetic

def test_synthetic_shapes_and_sizes():
    splits = load_dataset("synthetic", synthetic_samples=100, image_size=12)
    assert len(splits.train) == 100 and len(splits.test) == 25
    assert splits.num_classes == 10 and splits.input_shape == (3, 12, 12)
    image, label = splits.train[0]
    assert image.shape == (3, 12, 12) and image.dtype == torch.float32
    assert label.dtype == torch.int64 and 0 <= int(label) < 10
    assert load_dataset("synthetic", synthetic_samples=8).input_shape == (3, 32, 32)


def test_synthetic_deterministic_per_seed():
    a = load_dataset("synthetic", seed=1, synthetic_samples=64, image_size=8)
    b = load_dataset("synthetic", seed=1, synthetic_samples=64, image_size=8)
    c = load_dataset("synthetic", seed=2, synthetic_samples=64, image_size=8)
    for x, y in zip(a.train.tensors + a.test.tensors, b.train.tensors + b.test.tensors):
        assert torch.equal(x, y)
    assert not torch.equal(a.train.tensors[0], c.train.tensors[0])


def test_synthetic_is_learnable_but_not_separable_at_initialisation():
    splits = load_dataset("synthetic", seed=0, synthetic_samples=1024, image_size=8)
    x_test, y_test = splits.test.tensors
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    with torch.no_grad():
        initial = (model(x_test).argmax(1) == y_test).float().mean().item()
    accuracy = _trained_accuracy(model, splits, epochs=5, momentum=0.0)
    assert initial < 0.4
    assert accuracy > 0.8


# ---------------------------------------------------------------- teacher

@pytest.fixture(scope="module")
def teacher():
    return load_dataset("teacher", seed=0), load_dataset("teacher", seed=0), load_dataset("teacher", seed=1)


def test_teacher_sizes_shapes_and_balance(teacher):
    splits = teacher[0]
    x, y = splits.train.tensors
    assert x.shape == (24_000, 1, 16, 16) and len(splits.test) == 4_000
    assert splits.input_shape == (1, 16, 16) and splits.num_classes == 10
    counts = torch.bincount(y, minlength=10)
    assert counts.min().item() > 0.03 * len(y), counts.tolist()  # no class left out by the teacher


def test_teacher_images_follow_the_seed_and_the_labels_do_not_depend_on_it(teacher):
    a, b, c = teacher
    assert torch.equal(a.train.tensors[0], b.train.tensors[0]) and torch.equal(a.test.tensors[1], b.test.tensors[1])
    assert not torch.equal(a.train.tensors[0], c.train.tensors[0])
    # one labelling function: a nearest-neighbour vote across seeds agrees far above chance
    xa, ya = a.train.tensors
    xc, yc = c.test.tensors
    nearest = torch.cdist(xc[:500].flatten(1), xa.flatten(1)).topk(15, largest=False).indices
    vote = torch.mode(ya[nearest], dim=1).values
    assert (vote == yc[:500]).float().mean().item() > 0.2


def test_teacher_is_learnable_but_not_to_the_last_image(teacher):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    accuracy = _trained_accuracy(model, teacher[0], epochs=2, momentum=0.9)
    assert 0.5 < accuracy < 0.95, accuracy


def _trained_accuracy(model, splits, *, epochs, momentum) -> float:
    """Test accuracy of ``model`` after ``epochs`` in order over the training split (SGD, lr 0.1, batch 32)."""
    x, y = splits.train.tensors
    x_test, y_test = splits.test.tensors
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    for _ in range(epochs):
        for i in range(0, len(x), 32):
            loss = torch.nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


# ---------------------------------------------------------------- mnist

@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_mnist_reads_idx_files_back(tmp_path, layout):
    folder = tmp_path if layout == "flat" else tmp_path / "MNIST" / "raw"
    arrays = write_mnist(str(folder))
    splits = load_dataset("mnist", str(tmp_path))
    assert len(splits.train) == 20 and len(splits.test) == 10
    assert splits.num_classes == 10 and splits.input_shape == (1, 28, 28)
    assert [int(splits.train[i][1]) for i in range(20)] == arrays["train-labels-idx1-ubyte"].tolist()
    assert [int(splits.test[i][1]) for i in range(10)] == arrays["t10k-labels-idx1-ubyte"].tolist()
    image, _ = splits.test[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    raw = arrays["t10k-images-idx3-ubyte"][3]
    assert image[0, 5, 17].item() == pytest.approx((raw[5, 17] / 255.0 - 0.1307) / 0.3081, abs=1e-5)
    expected = (torch.from_numpy(raw).float() / 255.0 - 0.1307) / 0.3081
    assert torch.allclose(image[0], expected, atol=1e-5)


def test_mnist_image_size_resizes(tmp_path):
    write_mnist(str(tmp_path))
    splits = load_dataset("mnist", str(tmp_path), image_size=14)
    assert splits.input_shape == (1, 14, 14)
    assert splits.train[0][0].shape == (1, 14, 14)


def test_mnist_dataset_can_be_pickled_for_loader_workers(tmp_path):
    arrays = write_mnist(str(tmp_path))
    copy = pickle.loads(pickle.dumps(load_dataset("mnist", str(tmp_path)).train))
    assert int(copy[7][1]) == int(arrays["train-labels-idx1-ubyte"][7])


def test_mnist_folder_without_files_names_missing_files(tmp_path):
    with pytest.raises(DataError, match="MNIST files missing in .*train-images-idx3-ubyte.*t10k-labels-idx1-ubyte"):
        load_dataset("mnist", str(tmp_path))


def test_mnist_partial_files_names_only_the_missing_ones(tmp_path):
    write_mnist(str(tmp_path))
    os.remove(tmp_path / "t10k-labels-idx1-ubyte")
    with pytest.raises(DataError) as caught:
        load_dataset("mnist", str(tmp_path))
    message = str(caught.value)
    assert str(tmp_path) in message and "t10k-labels-idx1-ubyte" in message
    assert "train-images-idx3-ubyte" not in message


def test_mnist_bad_magic_names_the_file(tmp_path):
    write_mnist(str(tmp_path))
    bad = tmp_path / "t10k-images-idx3-ubyte"
    data = bytearray(bad.read_bytes())
    data[0:4] = struct.pack(">i", 1234567)
    bad.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte is not a valid MNIST idx file"):
        load_dataset("mnist", str(tmp_path))


def test_mnist_truncated_file_names_the_file(tmp_path):
    write_mnist(str(tmp_path))
    bad = tmp_path / "train-labels-idx1-ubyte"
    bad.write_bytes(bad.read_bytes()[:12])
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte is not a valid MNIST idx file"):
        load_dataset("mnist", str(tmp_path))


def test_mnist_image_and_label_counts_must_agree(tmp_path):
    write_mnist(str(tmp_path))
    write_idx(str(tmp_path / "train-labels-idx1-ubyte"), np.zeros(7, dtype=np.uint8), 2049)
    with pytest.raises(DataError, match="20 images but .* 7 labels"):
        load_dataset("mnist", str(tmp_path))


# ---------------------------------------------------------------- cifar10

def test_cifar10_reads_batches_back(tmp_path):
    _, batches = write_cifar(str(tmp_path))
    splits = load_dataset("cifar10", str(tmp_path))
    assert len(splits.train) == 20 and len(splits.test) == 3
    assert splits.num_classes == 10 and splits.input_shape == (3, 32, 32)
    train_labels = sum((batches[f"data_batch_{i}"]["labels"] for i in range(1, 6)), [])
    assert [int(splits.train[i][1]) for i in range(20)] == train_labels
    assert [int(splits.test[i][1]) for i in range(3)] == batches["test_batch"]["labels"]
    # Sample 6 is the third image of data_batch_2; rows are channel-major 3x32x32.
    image, _ = splits.train[6]
    raw = batches["data_batch_2"]["data"][2].reshape(3, 32, 32)
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    for channel, row, col in [(0, 0, 0), (1, 9, 30), (2, 31, 4)]:
        expected = (raw[channel, row, col] / 255.0 - CIFAR_MEAN[channel]) / CIFAR_STD[channel]
        assert image[channel, row, col].item() == pytest.approx(expected, abs=1e-5)


def test_cifar10_accepts_the_batches_folder_itself_and_image_size(tmp_path):
    folder, batches = write_cifar(str(tmp_path))
    splits = load_dataset("cifar10", folder, image_size=16)
    assert splits.input_shape == (3, 16, 16) and splits.test[0][0].shape == (3, 16, 16)
    assert int(splits.test[1][1]) == batches["test_batch"]["labels"][1]


def test_cifar10_missing_files_are_named(tmp_path):
    folder, _ = write_cifar(str(tmp_path))
    os.remove(os.path.join(folder, "data_batch_4"))
    os.remove(os.path.join(folder, "batches.meta"))
    with pytest.raises(DataError, match=r"CIFAR-10 files missing in .*cifar-10-batches-py: data_batch_4, batches.meta"):
        load_dataset("cifar10", str(tmp_path))


def test_cifar10_batch_that_is_not_a_pickle_names_the_file(tmp_path):
    folder, _ = write_cifar(str(tmp_path))
    with open(os.path.join(folder, "test_batch"), "wb") as out:
        out.write(b"this is not a pickle")
    # The train split is still fine, so the error comes from the test split.
    with pytest.raises(DataError, match=r"test_batch is not a valid CIFAR-10 file"):
        load_dataset("cifar10", str(tmp_path))


def test_cifar10_batch_without_data_key_names_the_file(tmp_path):
    folder, _ = write_cifar(str(tmp_path))
    with open(os.path.join(folder, "data_batch_3"), "wb") as out:
        pickle.dump({"labels": [1, 2]}, out)
    with pytest.raises(DataError, match=r"data_batch_3 is not a valid CIFAR-10 file"):
        load_dataset("cifar10", str(tmp_path))


# ---------------------------------------------------------------- imagenet

def test_imagenet_reads_class_folders(tmp_path):
    write_imagenet(str(tmp_path))
    splits = load_dataset("imagenet", str(tmp_path), image_size=32)
    assert splits.num_classes == 3 and splits.input_shape == (3, 32, 32)
    assert len(splits.train) == 6 and len(splits.test) == 3
    assert splits.train.classes == ["cat", "dog", "fish"]
    assert [int(splits.train[i][1]) for i in range(6)] == [0, 0, 1, 1, 2, 2]
    image, label = splits.test[2]
    assert int(label) == 2 and image.shape == (3, 32, 32) and image.dtype == torch.float32
    for channel, value in enumerate(COLOURS["fish"]):
        expected = (value / 255.0 - IMAGENET_MEAN[channel]) / IMAGENET_STD[channel]
        assert torch.allclose(image[channel], torch.full((32, 32), expected), atol=1e-5)
    assert pickle.loads(pickle.dumps(splits.train))[3][0].shape == (3, 32, 32)


def test_imagenet_default_size_is_224(tmp_path):
    write_imagenet(str(tmp_path), train_per_class=1)
    splits = load_dataset("imagenet", str(tmp_path))
    assert splits.input_shape == (3, 224, 224) and splits.train[0][0].shape == (3, 224, 224)


def test_imagenet_val_classes_must_match_train(tmp_path):
    write_imagenet(str(tmp_path))
    os.rename(tmp_path / "val" / "fish", tmp_path / "val" / "bird")
    with pytest.raises(DataError, match=r"only in train: fish; only in val: bird"):
        load_dataset("imagenet", str(tmp_path))


def test_imagenet_missing_val_folder(tmp_path):
    write_imagenet(str(tmp_path))
    for name in os.listdir(tmp_path / "val"):
        for image in os.listdir(tmp_path / "val" / name):
            os.remove(tmp_path / "val" / name / image)
        os.rmdir(tmp_path / "val" / name)
    os.rmdir(tmp_path / "val")
    with pytest.raises(DataError, match=r"ImageNet folder .*val is missing"):
        load_dataset("imagenet", str(tmp_path))


def test_imagenet_empty_folder_names_train(tmp_path):
    with pytest.raises(DataError, match=r"ImageNet folder .*train is missing"):
        load_dataset("imagenet", str(tmp_path))


def test_imagenet_class_folder_without_images(tmp_path):
    write_imagenet(str(tmp_path))
    os.makedirs(tmp_path / "train" / "zebra")
    os.makedirs(tmp_path / "val" / "zebra")
    with pytest.raises(DataError, match=r"no images found under .*train"):
        load_dataset("imagenet", str(tmp_path))


def test_imagenet_unreadable_image_names_the_file(tmp_path):
    write_imagenet(str(tmp_path))
    bad = tmp_path / "val" / "dog" / "dog_0.png"
    bad.write_bytes(b"not a png")
    splits = load_dataset("imagenet", str(tmp_path), image_size=8)
    with pytest.raises(DataError, match=r"dog_0.png is not a readable image"):
        splits.test[1]


# ---------------------------------------------------------------- argument errors

def test_unknown_dataset_lists_choices():
    with pytest.raises(DataError, match=r"^unknown dataset 'foo'; choose one of: "
                                        r"digits, fashion-mnist, synthetic, teacher, mnist, cifar10, imagenet$"):
        load_dataset("foo")
    assert DATASETS == ("digits", "fashion-mnist", "synthetic", "teacher", "mnist", "cifar10", "imagenet")


@pytest.mark.parametrize("name,hint", [("mnist", "train-images-idx3-ubyte"),
                                       ("cifar10", "cifar-10-batches-py"),
                                       ("imagenet", "train/<class>/")])
def test_file_datasets_need_data_dir(name, hint):
    with pytest.raises(DataError) as caught:
        load_dataset(name)
    message = str(caught.value)
    assert message.startswith(f"dataset '{name}' needs --data-dir pointing at")
    assert hint in message and "digits, synthetic and teacher need no files" in message


@pytest.mark.parametrize("name", ["mnist", "cifar10", "imagenet"])
def test_nonexistent_data_dir_is_named(tmp_path, name):
    missing = str(tmp_path / "no-such-folder")
    with pytest.raises(DataError, match=f"data directory {missing} does not exist"):
        load_dataset(name, missing)


@pytest.mark.parametrize("kwargs,text", [
    ({"image_size": 0}, "image_size must be a positive integer, got 0"),
    ({"image_size": -8}, "image_size must be a positive integer, got -8"),
    ({"image_size": 8.5}, "image_size must be a positive integer, got 8.5"),
    ({"synthetic_samples": 0}, "synthetic_samples must be an integer of at least 4 .*got 0"),
    ({"synthetic_samples": -5}, "synthetic_samples must be an integer of at least 4 .*got -5"),
])
def test_bad_sizes_are_named(kwargs, text):
    with pytest.raises(DataError, match=text):
        load_dataset("synthetic", **kwargs)


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError)
