"""Tests for hvd_async.models: shapes, stems, reproducible initialisation and errors."""
import pytest
import torch
from torch import nn

from hvd_async.data import load_dataset
from hvd_async.models import MODELS, ModelError, build_model


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("shape,classes", [((1, 8, 8), 10), ((3, 32, 32), 7)])
def test_forward_shapes(name, shape, classes):
    torch.manual_seed(0)
    model = build_model(name, shape, classes)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn((2,) + shape))
    assert out.shape == (2, classes) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_models_are_trainable_by_backprop():
    torch.manual_seed(0)
    for name in ("mlp", "cnn"):
        model = build_model(name, (1, 8, 8), 10)
        model(torch.randn(4, 1, 8, 8)).sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_resnet18_on_imagenet_sized_input_keeps_the_imagenet_stem():
    torch.manual_seed(0)
    model = build_model("resnet18", (3, 224, 224), 1000).eval()
    assert model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.MaxPool2d)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_resnet_small_inputs_get_the_cifar_stem():
    torch.manual_seed(0)
    for name in ("resnet18", "resnet50"):
        model = build_model(name, (1, 28, 28), 10)
        assert model.conv1.in_channels == 1 and model.conv1.out_channels == 64
        assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
        assert model.conv1.padding == (1, 1) and model.conv1.bias is None
        assert isinstance(model.maxpool, nn.Identity)
        assert model.fc.out_features == 10
    # The replaced stem is initialised like torchvision's convolutions (kaiming normal, fan out).
    expected_std = (2.0 / (64 * 3 * 3)) ** 0.5
    assert model.conv1.weight.std().item() == pytest.approx(expected_std, rel=0.15)


def test_resnet_large_grey_inputs_get_one_input_channel():
    torch.manual_seed(0)
    model = build_model("resnet18", (1, 96, 96), 5).eval()
    assert model.conv1.in_channels == 1 and model.conv1.kernel_size == (7, 7)
    assert model.conv1.stride == (2, 2) and isinstance(model.maxpool, nn.MaxPool2d)
    with torch.no_grad():
        assert model(torch.randn(1, 1, 96, 96)).shape == (1, 5)


def test_cnn_pools_only_inputs_of_16_or_more_and_handles_224():
    torch.manual_seed(0)
    small, large = build_model("cnn", (1, 8, 8), 10), build_model("cnn", (3, 224, 224), 4)
    assert not any(isinstance(m, nn.MaxPool2d) for m in small.modules())
    assert any(isinstance(m, nn.MaxPool2d) for m in large.modules())
    assert not any(isinstance(m, nn.BatchNorm2d) for m in large.modules())
    with torch.no_grad():
        assert large(torch.randn(1, 3, 224, 224)).shape == (1, 4)
        assert small(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_mlp_layout():
    model = build_model("mlp", (3, 4, 5), 6)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(60, 128), (128, 6)]


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_gives_identical_parameters(name):
    shape = (3, 32, 32)
    torch.manual_seed(123)
    a = build_model(name, shape, 10)
    torch.manual_seed(123)
    b = build_model(name, shape, 10)
    torch.manual_seed(124)
    c = build_model(name, shape, 10)
    params_a, params_b = list(a.state_dict().values()), list(b.state_dict().values())
    assert len(params_a) == len(params_b) > 0
    assert all(torch.equal(x, y) for x, y in zip(params_a, params_b))
    assert not torch.equal(a.state_dict()[next(iter(a.state_dict()))], c.state_dict()[next(iter(c.state_dict()))])


def test_build_model_does_not_reseed():
    torch.manual_seed(5)
    build_model("mlp", (1, 8, 8), 10)
    after_first = torch.rand(1)
    torch.manual_seed(5)
    build_model("mlp", (1, 8, 8), 10)
    build_model("mlp", (1, 8, 8), 10)
    assert not torch.equal(after_first, torch.rand(1))


def test_mlp_reaches_90_percent_on_digits():
    splits = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = build_model("mlp", splits.input_shape, splits.num_classes)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = splits.train.tensors
    for _ in range(10):
        order = torch.randperm(len(x))
        for i in range(0, len(x), 32):
            batch = order[i:i + 32]
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    x_test, y_test = splits.test.tensors
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    assert accuracy >= 0.9


def test_unknown_model_lists_choices():
    with pytest.raises(ModelError, match=r"^unknown model 'foo'; choose one of: mlp, cnn, lenet, resnet18, resnet50$"):
        build_model("foo", (1, 8, 8), 10)
    assert MODELS == ("mlp", "cnn", "lenet", "resnet18", "resnet50")
    assert issubclass(ModelError, ValueError)


@pytest.mark.parametrize("classes", [1, 0, -3, 2.5, True, "10"])
def test_bad_num_classes(classes):
    with pytest.raises(ModelError, match=rf"num_classes must be an integer of at least 2, got {classes!r}"):
        build_model("mlp", (1, 8, 8), classes)


@pytest.mark.parametrize("shape", [(1, 8), (1, 8, 8, 8), (0, 8, 8), (1, -8, 8), (1, 8.0, 8), "1x8x8", None])
def test_bad_input_shape(shape):
    with pytest.raises(ModelError) as caught:
        build_model("cnn", shape, 10)
    assert str(caught.value) == f"input_shape must be 3 positive integers (channels, height, width), got {shape!r}"
