"""Build the neural networks that the project trains, by name.

``build_model(name, input_shape, num_classes)`` returns a freshly initialised
``torch.nn.Module`` mapping a batch of ``input_shape`` images to class logits.
Initialisation draws from torch's global generator, so the caller's
``torch.manual_seed`` makes it reproducible; nothing here reseeds, and no
pretrained weights are ever loaded.

* ``mlp``: one hidden layer of 128 units.
* ``cnn``: two 3x3 convolutions, then pooling to 4x4; fits inputs from 8x8 to 224x224.
* ``resnet18`` / ``resnet50``: torchvision's ResNets; inputs up to 64x64 get the
  usual CIFAR stem (3x3 stride-1 first convolution and no max-pool).
"""
from typing import Tuple

from torch import nn

from .checks import is_int_at_least

MODELS = ("mlp", "cnn", "resnet18", "resnet50")

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
    return _resnet(name, channels, height, num_classes)


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

