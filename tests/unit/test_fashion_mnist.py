"""Fashion-MNIST from Debian's package, the fixed validation splits (fashion-mnist and digits), and
LeNet on 28x28 images."""
import os

import pytest
import torch
import torch.nn.functional as F

from hvd_async import data
from hvd_async.data import DataError, for_evaluation, load_dataset
from hvd_async.models import build_model

installed = pytest.mark.skipif(
    not os.path.isdir(data.FASHION_MNIST_DIR),
    reason=f"Debian's package {data.FASHION_MNIST_PACKAGE} is not installed (scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def fashion():
    return load_dataset("fashion-mnist")


@installed
def test_fashion_mnist_sizes_shapes_and_classes(fashion):
    assert (len(fashion.train), len(fashion.test)) == (60000, 10000)
    assert fashion.num_classes == 10 and fashion.input_shape == (1, 28, 28)
    image, label = fashion.train[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert int(label) == 9  # the first training image of Zalando's release is an ankle boot
    assert torch.bincount(fashion.train.tensors[1]).tolist() == [6000] * 10
    assert torch.bincount(fashion.test.tensors[1]).tolist() == [1000] * 10
    images = fashion.train.tensors[0]  # normalised with the training split's own mean and std
    assert abs(images.mean().item()) < 1e-3 and abs(images.std().item() - 1.0) < 1e-3


@installed
def test_fashion_mnist_images_are_torchvisions_per_image_transform(fashion):
    """The whole split converted at once equals torchvision's MNIST reader with its per-image transform."""
    from hvd_async import image_files

    names = image_files.MNIST_FILES[True] + image_files.MNIST_FILES[False]
    folder = image_files._uncompressed(data.FASHION_MNIST_DIR, [name + ".gz" for name in names])
    reference = image_files._mnist(folder, None, image_files.FASHION_MNIST_MEAN, image_files.FASHION_MNIST_STD)
    for i in (0, 1234, 59999):
        image, label = reference.train[i]
        assert torch.equal(image, fashion.train[i][0]) and label == int(fashion.train[i][1])
    assert torch.equal(reference.test[9999][0], fashion.test[9999][0])


@installed
def test_fashion_mnist_validation_split(fashion):
    """55,000 to train and 5,000 to score with --eval-on val; the test split is untouched."""
    val = for_evaluation(fashion, "fashion-mnist", "val")
    assert (len(val.train), len(val.test)) == (55000, 5000)
    assert set(val.train.indices).isdisjoint(val.test.indices)
    assert sorted(val.train.indices + val.test.indices) == list(range(60000))
    assert for_evaluation(fashion, "fashion-mnist", "test") is fashion  # final tables: the whole training split
    counts = torch.bincount(fashion.train.tensors[1][val.test.indices], minlength=10)
    assert counts.min() > 400 and counts.max() < 600  # a random draw, every class about a tenth


@pytest.mark.parametrize("name", ["digits", "teacher"])
def test_the_splits_are_the_same_for_every_run_seed(name):
    """The run seed changes initialisation and order, never which images train, validate or test."""
    first = for_evaluation(load_dataset(name, seed=1), name, "val")
    second = for_evaluation(load_dataset(name, seed=2), name, "val")
    assert first.train.indices == second.train.indices and first.test.indices == second.test.indices
    assert set(first.train.indices).isdisjoint(first.test.indices)
    assert len(first.train) + len(first.test) == len(load_dataset(name).train)


def test_digits_test_split_is_fixed_and_validation_carved_from_training():
    one, two = load_dataset("digits", seed=1), load_dataset("digits", seed=7)
    assert torch.equal(one.train.tensors[0], two.train.tensors[0])
    assert torch.equal(one.test.tensors[1], two.test.tensors[1])
    val = for_evaluation(one, "digits", "val")
    assert (len(val.train), len(val.test), len(one.test)) == (1150, 287, 360)
    train_images = {tuple(x.flatten().tolist()) for x in one.train.tensors[0][val.train.indices]}
    val_images = [tuple(x.flatten().tolist()) for x in one.train.tensors[0][val.test.indices]]
    test_images = [tuple(x.flatten().tolist()) for x in one.test.tensors[0]]
    assert sum(image in train_images for image in val_images) <= 2  # digits has a few duplicate images
    assert sum(image in train_images for image in test_images) <= 2


def test_unknown_split_to_score():
    with pytest.raises(DataError, match="choose one of: test, val"):
        for_evaluation(load_dataset("digits"), "digits", "train")


def test_missing_package_names_it_and_the_apt_command(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "FASHION_MNIST_DIR", str(tmp_path / "absent"))
    with pytest.raises(DataError) as error:
        load_dataset("fashion-mnist")
    message = str(error.value)
    assert "\n" not in message
    assert "dataset-fashion-mnist" in message and "apt-get install dataset-fashion-mnist" in message


def test_lenet_output_shape_and_size():
    torch.manual_seed(0)
    model = build_model("lenet", (1, 28, 28), 10)
    assert model(torch.randn(5, 1, 28, 28)).shape == (5, 10)
    assert sum(p.numel() for p in model.parameters()) == 61706  # LeNet-5's layers on 28x28 inputs
    assert build_model("lenet", (1, 8, 8), 10)(torch.randn(2, 1, 8, 8)).shape == (2, 10)


@installed
def test_lenet_learns_from_fashion_mnist_batches(fashion):
    """A few dozen SGD steps at the job's batch size bring the loss on the same batches down."""
    torch.manual_seed(0)
    model = build_model("lenet", fashion.input_shape, fashion.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = fashion.train.tensors[0][:256], fashion.train.tensors[1][:256]
    before = F.cross_entropy(model(x), y).item()
    for _ in range(5):
        for i in range(0, 256, 32):
            loss = F.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
    after = F.cross_entropy(model(x), y).item()
    assert before == pytest.approx(2.30, abs=0.05)  # ln 10: an untrained model's loss
    assert after < 0.7 * before, (before, after)


def test_fashion_mnist_defaults_are_the_records_choice_and_flags_win(tmp_path):
    """--dataset fashion-mnist gets the lr that ssgd's sweep on the validation split chose (and lenet);
    a flag or a --config key wins over them; other datasets keep the job's defaults."""
    import json

    from hvd_async.job import config

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results", "fmnist_lr_sweep.json")
    with open(path) as f:
        record = json.load(f)
    assert record["settings"]["evaluated_on"] == "val" and record["chosen_lr"] is not None
    assert not {11, 12, 13, 14, 15, 16, 17, 18, 19, 20} & set(record["settings"]["seeds"])
    chosen = config.DATASET_DEFAULTS["fashion-mnist"]
    assert chosen == {"model": "lenet", "lr": record["chosen_lr"]}
    args = config.parse(["--dataset", "fashion-mnist"])
    assert (args.model, args.lr, args.momentum) == ("lenet", record["chosen_lr"], 0.9)
    assert config.parse(["--dataset", "fashion-mnist", "--lr", "0.3"]).lr == 0.3
    preset = tmp_path / "run.yaml"
    preset.write_text("dataset: fashion-mnist\nmodel: mlp\n")
    args = config.parse(["--config", str(preset)])
    assert (args.model, args.lr) == ("mlp", record["chosen_lr"])
    assert (config.parse([]).model, config.parse([]).lr) == ("mlp", 0.1)
