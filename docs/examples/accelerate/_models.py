"""What the Accelerate profiler guide's samples share: a ResNet-18 made of ``torch.nn`` and its inputs.

The guide uses ``torchvision.models.resnet18()``. The only torchvision built for
torch 2.13 is a CUDA build that fails to import next to torch's CPU wheel
(``operator torchvision::nms does not exist``), so this is the same network
(the same layers, widths and operator sequence: conv2d, batch_norm, relu_,
max_pool2d, add_, adaptive_avg_pool2d, linear) written with ``torch.nn`` only.

The samples take two options of their own, so that tests can run them quickly
and keep their files out of the working directory: ``--image-size`` (the guide
uses 224) and ``--out`` (where files go).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
from torch import nn

#: The guide's batch: ``torch.randn(5, 3, 224, 224)``.
GUIDE_BATCH = 5
GUIDE_IMAGE_SIZE = 224


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut, as in torchvision's ResNet-18."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's ``resnet18()`` architecture (11.7 M parameters), untrained."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(64, 64, 1), BasicBlock(64, 64, 1))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128, 1))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256, 1))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512, 1))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> ResNet18:
    """Stand-in for ``torchvision.models.resnet18()``."""
    return ResNet18()


def parse_sample_args(
    description: str, default_out: str, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """The two options every sample takes: ``--image-size`` and ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--image-size",
        type=int,
        default=GUIDE_IMAGE_SIZE,
        help="height and width of the input images (default: %(default)s, as in the guide)",
    )
    parser.add_argument(
        "--out", default=default_out, help="where the sample writes files (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.image_size < 32:
        parser.error(f"--image-size must be at least 32 (ResNet-18 halves it 5 times), got {args.image_size}")
    return args


def guide_inputs(image_size: int) -> torch.Tensor:
    """The guide's ``torch.randn(5, 3, 224, 224)``, at ``image_size``."""
    return torch.randn(GUIDE_BATCH, 3, image_size, image_size)
