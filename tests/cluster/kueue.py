"""Kueue on the test control plane: its controller manager (built from `sigs.k8s.io/kueue` by
build_tools.sh) as a local process, with Kueue's CRDs, a configuration written here and its webhooks
for Kueue's own API (Workloads, ClusterQueues, ResourceFlavors, Cohorts) registered by URL on the
loopback with a serving certificate from the cluster's CA. Kueue's webhooks for other job kinds (batch
Jobs, pods, JobSets, ...) are left out: no test creates those, and registering the pod webhook would put
Kueue in front of every pod of the cluster.

Configuration that matters: ElasticJobsViaWorkloadSlices on (a job grows through a new Workload slice);
VisibilityOnDemand off (its API server wants certificates of its own and an APIService); no leader
election (one process); Kueue's own certificate management off (the test's CA signs instead).
"""

from __future__ import annotations

import base64
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.cluster.cluster import Cluster, _name, spawn, stop_groups
from tests.helpers import free_port, wait_for

VERSION = "v0.17.0"
GROUP = "kueue.x-k8s.io"


@dataclass
class Kueue:
    cluster: Cluster

    @property
    def folder(self) -> Path:
        return self.cluster.bin / f"kueue-{VERSION}"

    def start(self, timeout: float = 120) -> None:
        cluster, manifests = self.cluster, self.folder / "manifests"
        cluster.kubectl(
            "apply", "--server-side", *(f"--filename={f}" for f in sorted(manifests.glob(f"{GROUP}_*.yaml")))
        )
        cluster.wait_established(*(f.stem.split("_", 1)[1] + f".{GROUP}" for f in manifests.glob(f"{GROUP}_*.yaml")))
        directory = cluster.directory / "kueue"
        certs = directory / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        cluster.pki.issue("kueue-webhook", _name("kueue-webhook"), server_names=["127.0.0.1"])
        shutil.copy(cluster.pki.path("kueue-webhook.crt"), certs / "tls.crt")
        shutil.copy(cluster.pki.path("kueue-webhook.key"), certs / "tls.key")
        self.webhook_port, self.health_port = free_port(), free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job"]},  # it may not be empty; Jobs need no CRD
            "featureGates": {"ElasticJobsViaWorkloadSlices": True, "VisibilityOnDemand": False},
        }
        (directory / "config.yaml").write_text(yaml.safe_dump(config))
        command = [
            "env", f"KUEUE_METRICS_CERT_DIR={certs}",  # build_tools.sh: the metrics server's keypair
            str(self.folder / "kueue"), f"--config={directory / 'config.yaml'}", f"--kubeconfig={cluster.kubeconfig}",
        ]  # fmt: skip
        cluster.commands["kueue"] = command
        cluster.processes["kueue"] = spawn(command, cluster.directory / "kueue.log")
        cluster._write_pids()
        wait_for(self._ready, timeout, what=f"Kueue ready (see {cluster.directory / 'kueue.log'})")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self._webhooks()))

    def _ready(self) -> bool:
        process = self.cluster.processes["kueue"]
        if process.poll() is not None:
            raise RuntimeError(f"kueue exited with {process.returncode}; see {self.cluster.directory / 'kueue.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except urllib.error.URLError:
            return False

    def _webhooks(self) -> list[dict]:
        """Kueue's webhook configurations with only the webhooks for its own API, each called by URL."""
        ca = base64.b64encode(Path(self.cluster.pki.path("ca.crt")).read_bytes()).decode()
        out = []
        for document in yaml.safe_load_all((self.folder / "manifests" / "webhooks.yaml").read_text()):
            kept = []
            for webhook in document["webhooks"]:
                if not all(GROUP in rule["apiGroups"] for rule in webhook["rules"]):
                    continue
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca}
                kept.append(webhook)
            document["metadata"]["name"] = f"kueue-{document['metadata']['name']}"
            out.append(document | {"webhooks": kept})
        return out

    def stop(self) -> None:
        process = self.cluster.processes.pop("kueue", None)
        if process:
            stop_groups([process.pid])
            process.wait()
