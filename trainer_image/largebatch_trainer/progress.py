"""Where rank 0 reports progress: a JSON file written atomically (the local runner), or the job's
`status` on Kubernetes (a merge patch of the status subresource, sent by a thread of its own)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from largebatch import files


class Sink(Protocol):
    def report(self, status: dict) -> None: ...

    def close(self, timeout: float) -> bool:
        """Deliver what is still pending, waiting at most `timeout` seconds; False if it could not."""
        ...


class FileSink:
    def __init__(self, path: Path):
        self.path = path

    def report(self, status: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        files.replace(self.path, lambda temporary: temporary.write_text(json.dumps(status)))

    def close(self, timeout: float) -> bool:
        return True  # written at once


class KubernetesSink:
    """Patches `status.progress` and `status.plan` of one LargeBatchJob; the worker's service account
    may patch the status of that job and nothing else (see the chart's RBAC).

    A thread of its own sends the reports, so that an API server that is slow, restarting or refusing the
    patch (an admission policy, a quota) never holds up training nor ends it: the newest report waits
    and is sent once the server takes it, with a growing pause between tries; a newer report supersedes
    an unsent one, since each carries the whole progress."""

    REQUEST_SECONDS = 10.0
    """A patch that got no answer in this long is tried again (a server stopped mid-request never answers)."""
    MAX_PAUSE_SECONDS = 8.0

    def __init__(self, namespace: str, name: str):
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:  # outside a pod: $KUBECONFIG or ~/.kube/config
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        self.api = client.CustomObjectsApi()
        self.namespace, self.name = namespace, name
        self._ready = threading.Condition()
        self._pending: dict | None = None
        self._sending = False
        self._thread = threading.Thread(target=self._deliver, name="status-reports", daemon=True)
        self._thread.start()

    def report(self, status: dict) -> None:
        with self._ready:
            self._pending = status
            self._ready.notify_all()

    def close(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._ready:
            while self._pending is not None or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    print(f"the job's status was not updated: its last report was still refused after {timeout:.0f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
                    return False
                self._ready.wait(left)
        return True

    def _deliver(self) -> None:
        failures = 0
        while True:
            with self._ready:
                while self._pending is None:
                    self._ready.wait()
                status, self._pending, self._sending = self._pending, None, True
            try:
                self._patch(status)
            except Exception as exc:  # whatever the server or the connection said: the report is kept
                failures += 1
                if failures == 1:
                    print(f"status report refused ({_first_line(exc)}); training goes on, the report is retried",
                          file=sys.stderr, flush=True)  # fmt: skip
                with self._ready:
                    if self._pending is None:
                        self._pending = status
                    self._sending = False
                    self._ready.notify_all()
                time.sleep(min(2.0 ** (failures - 1), self.MAX_PAUSE_SECONDS))
            else:
                if failures:
                    print(f"status reports resumed after {failures} refused", file=sys.stderr, flush=True)
                failures = 0
                with self._ready:
                    self._sending = False
                    self._ready.notify_all()

    def _patch(self, status: dict) -> None:
        from largebatch import api

        body = {"status": {"progress": status["progress"], "plan": status["plan"]}}
        self.api.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name, body, _request_timeout=self.REQUEST_SECONDS
        )


def _first_line(exc: Exception) -> str:
    if getattr(exc, "status", None):  # the server's answer (kubernetes.client.ApiException)
        return f"HTTP {exc.status} {exc.reason}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def make_sink(progress_file: str | None, kubernetes_job: str | None) -> Sink | None:
    if progress_file:
        return FileSink(Path(progress_file))
    if kubernetes_job:
        namespace, _, name = kubernetes_job.rpartition("/")
        return KubernetesSink(namespace or "default", name)
    return None
