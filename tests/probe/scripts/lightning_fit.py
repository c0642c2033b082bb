"""A real Lightning fit on the CPU: Lightning owns the loop, the optimizer and the DataLoader
iteration; the probe must still see its 12 steps and the loader's batches."""

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning as L
except ImportError:  # older installs ship only pytorch_lightning
    import pytorch_lightning as L


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 2)

    def training_step(self, batch, _index):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randint(0, 2, (256,)))
trainer = L.Trainer(max_steps=12, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2)
model = Tiny()
trainer.fit(model, DataLoader(data, batch_size=8, num_workers=0))
print("final weight sum", repr(float(model.net.weight.sum())))
