"""Where rank 0 reports progress: a JSON file written atomically (the local runner), or the job's
`status` on Kubernetes (a merge patch of the status subresource)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol

from largebatch import files


class Sink(Protocol):
    def report(self, status: dict) -> None: ...


class FileSink:
    def __init__(self, path: Path):
        self.path = path

    def report(self, status: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        files.replace(self.path, lambda temporary: temporary.write_text(json.dumps(status)))


class KubernetesSink:
    """Patches `status.progress` and `status.plan` of one LargeBatchJob; the worker's service account
    may patch the status of that job and nothing else (see the chart's RBAC)."""

    def __init__(self, namespace: str, name: str):
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:  # outside a pod: $KUBECONFIG or ~/.kube/config
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        self.api = client.CustomObjectsApi()
        self.namespace, self.name = namespace, name

    def report(self, status: dict) -> None:
        from largebatch import api

        body = {"status": {"progress": status["progress"], "plan": status["plan"]}}
        self.api.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name, body
        )


def make_sink(progress_file: str | None, kubernetes_job: str | None) -> Sink | None:
    if progress_file:
        return FileSink(Path(progress_file))
    if kubernetes_job:
        namespace, _, name = kubernetes_job.rpartition("/")
        return KubernetesSink(namespace or "default", name)
    return None
