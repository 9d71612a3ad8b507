"""An example autocompile plugin: a residual MLP classifier trained on random features.

A workload is a `Workload`: how to build the model and optimizer, how to make batches, how
to compute the loss, how many items a batch holds. This one has fixed-size inputs, so it
declares no varying dimensions (the padding dimensions are left out of its search space),
and its repeated blocks sit in a ModuleList, so regional compilation finds them itself.
"""

from __future__ import annotations

import torch

from autocompile.workloads import Workload, WorkloadOptions

FEATURES, WIDTH, CLASSES, DEPTH = 64, 128, 10, 4


class ResidualMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(FEATURES, WIDTH)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()) for _ in range(DEPTH)
        )
        self.head = torch.nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def mlp_example() -> Workload:
    def build(options: WorkloadOptions):
        torch.manual_seed(options.seed)
        model = ResidualMLP().to(options.device)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def batches(options: WorkloadOptions, n: int):
        generator = torch.Generator().manual_seed(options.seed)
        size = options.batch_size or 32
        return [
            {
                "x": torch.randn(size, FEATURES, generator=generator).to(options.device),
                "y": torch.randint(0, CLASSES, (size,), generator=generator).to(options.device),
            }
            for _ in range(n)
        ]

    def loss(model, batch):
        return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    return Workload(
        name="mlp-example",
        description="example plugin: residual MLP classifier on random features, SGD",
        build=build,
        batches=batches,
        loss=loss,
        count=lambda batch: batch["x"].shape[0],
        unit="samples",
        batch_pool=4,
    )
