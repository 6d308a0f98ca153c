"""A LightningModule on random CPU data, fitted with Lightning's PyTorchProfiler.

Run by tests/test_outside_stop.py under ``polyprof run``, and imported by
lightning_profiler.py beside it, which fits it inside a ``polyprof.profile``.
"""

import lightning
import torch
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(root: str | None = None) -> lightning.Trainer:
    """Fit for one epoch of 4 steps; Lightning writes its profiler's traces into ``root`` (default: here)."""
    data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 2)), batch_size=8)
    trainer = lightning.Trainer(
        max_epochs=1,
        limit_train_batches=4,
        profiler=PyTorchProfiler(),
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(Model(), data)
    return trainer


if __name__ == "__main__":
    fit()
    print("FITTED")
