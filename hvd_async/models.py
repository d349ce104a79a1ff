"""Build the neural networks that the project trains, by name.

``build_model(name, input_shape, num_classes)`` returns a freshly initialised
``torch.nn.Module`` mapping a batch of ``input_shape`` images to class logits.
Initialisation draws from torch's global generator, so the caller's
``torch.manual_seed`` makes it reproducible; nothing here reseeds, and no
pretrained weights are ever loaded.

* ``mlp``: one hidden layer of 128 units.
* ``cnn``: two 3x3 convolutions, then pooling to 4x4; fits inputs from 8x8 to 224x224.
* ``lenet``: LeNet-5 (LeCun et al., 1998, "Gradient-based learning applied to document
  recognition") with ReLU and max-pooling: 5x5 convolutions of 6 and 16 channels, each
  followed by 2x2 pooling, then 120, 84 and ``num_classes`` units (61,706 parameters on
  28x28 images). It pools early, so it is sized for CPUs: on 28x28 images its second
  convolution runs at 14x14 (``cnn``'s both run at full resolution). Inputs under 16x16
  (digits) skip the first pooling and pad the second convolution.
* ``resnet18`` / ``resnet50``: torchvision's ResNets; inputs up to 64x64 get the
  usual CIFAR stem (3x3 stride-1 first convolution and no max-pool).
"""
from typing import Tuple

from torch import nn

from .checks import is_int_at_least

MODELS = ("mlp", "cnn", "lenet", "resnet18", "resnet50")

# Inputs at most this high get the small-image ResNet stem.
SMALL_INPUT = 64


class ModelError(ValueError):
    """Bad model name or arguments; the message names the bad value."""


def build_model(name: str, input_shape: Tuple[int, int, int], num_classes: int) -> nn.Module:
    """Return a new, randomly initialised model ``name`` for ``input_shape`` (C, H, W) images."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    if not (isinstance(input_shape, (tuple, list)) and len(input_shape) == 3
            and all(is_int_at_least(v, 1) for v in input_shape)):
        raise ModelError(f"input_shape must be 3 positive integers (channels, height, width), "
                         f"got {input_shape!r}")
    if not is_int_at_least(num_classes, 2):
        raise ModelError(f"num_classes must be an integer of at least 2, got {num_classes!r}")
    channels, height, width = (int(v) for v in input_shape)
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * height * width, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2) if height >= 16 else nn.Identity(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(64 * 16, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )
    if name == "lenet":
        return _lenet(channels, height, width, num_classes)
    return _resnet(name, channels, height, num_classes)


def _lenet(channels: int, height: int, width: int, num_classes: int) -> nn.Module:
    small = min(height, width) < 16  # (digits' 8x8: no pooling before the second convolution)
    pad = 2 if small else 0
    side = [s if small else s // 2 for s in (height, width)]  # after the first convolution (padded) and pooling
    side = [(s + 2 * pad - 4) // 2 for s in side]  # after the second convolution and pooling
    if min(side) < 1:
        raise ModelError(f"lenet needs images of at least 2x2, got {height}x{width}")
    return nn.Sequential(
        nn.Conv2d(channels, 6, 5, padding=2),
        nn.ReLU(),
        nn.Identity() if small else nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side[0] * side[1], 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, num_classes),
    )


def _resnet(name: str, channels: int, height: int, num_classes: int) -> nn.Module:
    import torchvision.models  # here, not at the top: jobs with the small models never load torchvision

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if height <= SMALL_INPUT:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    else:
        return model
    # Initialise the new stem as torchvision initialises its convolutions.
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model

