"""The notes' ``models.resnet18()``, or a small stand-in where torchvision is not installed.

The stand-in has resnet18's kinds of layers (convolution, batch norm, ReLU, max pool, mean pool,
linear), so the table shows the same ops, and it runs in a fraction of resnet18's time.
"""

import torch


def resnet18_or_stand_in():
    try:
        from torchvision import models
    except ImportError:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 7, stride=2, padding=3),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, stride=2, padding=1),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.BatchNorm2d(32),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 1000),
        )
    return models.resnet18()
