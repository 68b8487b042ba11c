"""precision-tool: find the op that broke a training run's precision, and say why."""

__version__ = "0.1.0"
