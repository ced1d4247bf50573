"""The test control plane (see cluster.py)."""
