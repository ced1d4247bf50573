"""largebatch: a Kubernetes-native orchestrator for large-batch PyTorch training.

The pure core (`api`, `schedule`, later `controller`) has no I/O and no torch; the shells (CLI, local
runner, kopf operator) observe and act around it.
"""

__version__ = "0.1.0"
