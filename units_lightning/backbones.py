"""Backbones: the 4-conv network that MAML, MAML++ and Units-ML share."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["ConvNet"]


class ConvNet(nn.Module):
    """``blocks`` x [conv 3x3 (pad 1, Xavier) -> batch norm -> leaky ReLU -> max-pool 2] -> linear.

    Batch norm is transductive, as in the authors' code: it always normalises with the statistics of the
    batch it sees (a support set or one query set) and keeps no running statistics, so training, scoring
    and evaluation behave the same and no buffers are shared between adapted copies.

    Args:
        image_shape: (channels, height, width) of the input images.
        out_features: number of classes (n_way).
        filters: channels of every conv layer (64 for Omniglot and CIFAR-FS, 48 for mini-ImageNet).
        blocks: number of conv blocks.

    Example:
        >>> import torch
        >>> net = ConvNet((1, 28, 28), out_features=5, filters=8)
        >>> net(torch.zeros(3, 1, 28, 28)).shape
        torch.Size([3, 5])
    """

    def __init__(
        self, image_shape: tuple[int, int, int] = (1, 28, 28), out_features: int = 5, filters: int = 64, blocks: int = 4
    ):
        super().__init__()
        channels, height, width = image_shape
        layers: list[nn.Module] = []
        for block in range(blocks):
            conv = nn.Conv2d(channels if block == 0 else filters, filters, kernel_size=3, padding=1)
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.BatchNorm2d(filters, track_running_stats=False), nn.LeakyReLU(), nn.MaxPool2d(2)]
            height, width = height // 2, width // 2
        if height < 1 or width < 1:
            raise ValueError(f"images of shape {tuple(image_shape)} are too small for {blocks} pooling blocks")
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.classifier = nn.Linear(filters * height * width, out_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
