"""The operator as a local process for e2e tests: `python -m largebatch.kube` from a torch-free
`pip install largebatch` (tests/cluster/operator_venv.py, as in the operator image) with the chart's
ServiceAccount credentials, watching one namespace, fast timings, and its metrics on a port of its own."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.operator_venv import clean_env, operator_python
from tests.cluster.proxy import Proxy
from tests.helpers import bound, free_port

FAST = {
    "LARGEBATCH_RECONCILE_SECONDS": "0.5",
    "LARGEBATCH_RESTART_SECONDS": "0",
    "LARGEBATCH_UNSCHEDULABLE_GRACE_SECONDS": "3",
    "LARGEBATCH_CAPACITY_RETRY_SECONDS": "300",  # long: a test that sees a job grow saw the node watch do it
}


@dataclass
class OperatorProcess:
    process: subprocess.Popen
    log: Path
    metrics_port: int

    @classmethod
    def start(cls, kubeconfig: Path, namespace: str, log: Path, **env: str) -> OperatorProcess:
        port = free_port()
        # Its own temporary folder, as a pod's container has its own /tmp: the kubernetes client writes the
        # kubeconfig's CA there and removes it at exit, which a killed operator never reaches.
        tmp = log.parent / f"{log.stem}-tmp"
        tmp.mkdir(exist_ok=True)
        variables = dict(clean_env(), KUBECONFIG=str(kubeconfig), LARGEBATCH_WATCH_NAMESPACES=namespace,
                         LARGEBATCH_OPERATOR_METRICS_PORT=str(port), TMPDIR=str(tmp), **FAST) | env  # fmt: skip
        with open(log, "ab") as out:
            process = subprocess.Popen([str(operator_python()), "-m", "largebatch.kube"], env=variables, stdout=out,
                                       stderr=subprocess.STDOUT)  # fmt: skip
        return cls(process, log, port)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL), and wait for the exit: within the watchdog's CLOSE_SECONDS of its cleanup
        even where kopf's own stop hangs."""
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=bound(30))

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """(sample name, sorted labels) → value, scraped from /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@contextlib.contextmanager
def through_proxy(cluster, kubeconfig, namespace: str, log, **env: str) -> Iterator[tuple[OperatorProcess, Proxy]]:
    """The operator reaching the API server through a Proxy of its own, to be cut off; both stopped at the end."""
    proxy = Proxy(cluster.server)
    try:
        operator = OperatorProcess.start(proxy.kubeconfig(kubeconfig), namespace, log, **env)
        try:
            yield operator, proxy
        finally:
            operator.stop()
    finally:
        proxy.close()
