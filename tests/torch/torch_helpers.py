"""Tiny models and a training loop shared by the PyTorch front-end tests."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")


class MLP(torch.nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, hidden)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(hidden, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def make_mlp(seed: int = 0, scale: float = 1.0):
    """An MLP, its SGD optimizer and one fixed batch; ``scale`` multiplies the inputs."""
    torch.manual_seed(seed)
    model = MLP()
    x = torch.randn(5, 8) * scale
    y = torch.randint(0, 4, (5,))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), x, y


def train(run, steps: int = 1) -> list[float]:
    model, optimizer, x, y = run
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
