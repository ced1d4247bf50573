"""Helpers for e2e tests that work with LargeBatchJobs on the test control plane."""

from __future__ import annotations

import yaml

from tests.helpers import EXAMPLES, ROOT

CRD = ROOT / "crds" / "largebatchjobs.largebatch.io.yaml"
CHART = ROOT / "charts" / "largebatch"
RELEASE = "largebatch"
OPERATOR_NAMESPACE = "largebatch-system"


def apply(cluster, document: dict, namespace: str):
    """`kubectl apply` a document; the result says whether the API server took it."""
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document), check=False)


def seesaw() -> dict:
    return yaml.safe_load((EXAMPLES / "seesaw.yaml").read_text())
