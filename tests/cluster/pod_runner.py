"""Runs the containers of KWOK pods as local processes: KWOK pods run nothing, so for e2e tests that
train for real, every pod of a namespace that the real scheduler has bound to a node and that carries
a LargeBatchJob's label gets its container's command, arguments and environment started here, and a
SIGTERM (then SIGKILL after the pod's grace period) when the pod is deleted.

How a pod becomes a process (see README.md):
- `python` is this interpreter; the container's image is ignored (the packages come from this checkout).
  A torchrun agent or a rendezvous store is forked from a zygote that imported torch once
  (tests/zygote.py); test_real_node starts its pods from their images.
- Volumes: a ConfigMap is written out to a folder; a PersistentVolumeClaim is one folder per claim
  shared by every pod that mounts it; an emptyDir is a folder of the pod. Every mount path in the
  command and the environment is replaced by its folder.
- Ports: each container port gets a free local port, passed as `--port=` to the rendezvous store, and
  `SERVICE:PORT` in a command resolves to the local port of the running pod behind that Service. A pod
  that replaces one of the same name gets the same ports, as a Service keeps its address when the pod
  behind it is replaced: processes that resolved it before reach the new pod.
- Credentials: the pod's ServiceAccount token (`kubectl create token`) in a kubeconfig of its own, as
  the in-cluster config would give it: the trainer reports with exactly the rights its pod has.
- A container's /tmp is its own (torchrun leaves a folder there at every start): TMPDIR is a folder of
  the pod.
- No CUDA here: LARGEBATCH_DEVICE=cpu; metrics are off (LARGEBATCH_METRICS_PORT=0), one thread a process.
- What the kubelet reports: a pod with `restartPolicy: Never` whose process ends gets phase Succeeded
  or Failed and a terminated container status with the exit code and, as `FallbackToLogsOnError` does,
  the log's last 80 lines (at most 2048 bytes) as the message. A pod naming an image pull secret that
  does not exist is not started and gets the `ErrImagePull` waiting state (images are not pulled here,
  so this stands in for a private registry refusing the pull).
- An API server that is away (stopped, or answering 5xx while etcd is): tried again every 0.2 s, as a
  kubelet does; what that raised is kept in `unavailable`, apart from `errors`, which tests expect empty.
- A pod held still (`paused`): the processes its container started (a worker's trainers) are stopped
  (SIGSTOP) inside the block and go on after it.
- A node lost (`lose_node`): its pods' processes are frozen (SIGSTOP) until the runner stops, nothing of
  them is reported and nothing more is started on the node: a machine that lost its power or its
  network answers nothing, not even with a reset, and its peers learn of it only from their own
  timeouts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client

from largebatch.kube.manifests import JOB_LABEL
from largebatch.local.nodes import descendants, kill_tree
from tests import zygote
from tests.helpers import bound, free_port


@dataclass
class Running:
    uid: str
    process: subprocess.Popen | zygote.Forked
    ports: dict[int, int]  # container port -> local port
    labels: dict[str, str]
    grace: float
    report_exit: bool  # restartPolicy Never: the pod ends with its process
    container: str
    node: str


MESSAGE_LINES, MESSAGE_BYTES = 80, 2048  # the kubelet's FallbackToLogsOnError limits


class PodRunner:
    def __init__(self, cluster, namespace: str, directory: Path):
        self.cluster, self.namespace, self.directory = cluster, namespace, directory
        self.core = client.CoreV1Api(cluster.api)
        self.running: dict[str, Running] = {}
        self.started: list[str] = []  # the names of the pods started, in order (a replacement again)
        self._uids: set[str] = set()
        self._ports: dict[tuple[str, int], int] = {}  # (pod name, container port) -> local port, kept
        self.lost_nodes: set[str] = set()
        self._frozen: list[Running] = []  # the processes of lost nodes' pods
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._lock = threading.Lock()  # the loop's thread and a test's `lose_node` both change `running`
        self.errors: list[str] = []
        self.unavailable: list[str] = []  # what the API server's absence raised (a control-plane fault's tests)

    def __enter__(self) -> PodRunner:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._zygote = zygote.start(self.directory / "zygote.log")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=bound(30))
        for name in list(self.running):
            self._end(name)
        for run in self._frozen:
            kill_tree(run.process.pid)
            run.process.wait()
        self._zygote.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._sync()
            except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
                self.unavailable.append(repr(exc))  # no API server: as a kubelet does, try again
            except client.ApiException as exc:
                (self.unavailable if exc.status >= 500 else self.errors).append(repr(exc))  # 5xx: etcd away
            except Exception as exc:  # keep running; the test sees what went wrong
                self.errors.append(repr(exc))
            self._stop.wait(0.2)

    def _sync(self) -> None:
        # The pods as JSON rather than the client's models: this list runs five times a second for as long as
        # a test trains, and with five pods it cost 6.9 ms of the test's CPU through the models, 2.1 as JSON.
        response = self.core.list_namespaced_pod(self.namespace, label_selector=JOB_LABEL, _preload_content=False)
        pods = json.loads(response.data)["items"]
        alive = {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
        for name, run in list(self.running.items()):
            if name not in alive or alive[name]["metadata"]["uid"] != run.uid:
                self._end(name)
            elif run.report_exit and run.process.poll() is not None:
                self._report_exit(name, run)
        for pod in alive.values():
            node = pod["spec"].get("nodeName")
            if node and node not in self.lost_nodes and pod["metadata"]["uid"] not in self._uids:
                self._start(pod)

    @contextlib.contextmanager
    def paused(self, name: str) -> Iterator[None]:
        """Hold the processes pod `name`'s container started still (SIGSTOP) inside the block, then let them
        go on (SIGCONT): for a test that must leave part of a run for after an outage, however fast this
        machine trains. The container's own process (a worker's torchrun agent) keeps running: stopped, it
        would miss its rendezvous heartbeats and its peers would count it gone.

        Without the runner's lock: the loop holds it through its requests, and an API server whose etcd is
        away keeps a request for up to a minute before it answers, which held a pause back that long."""
        run = self.running[name]  # one read of a dict: atomic, and the pod's entry is all that is needed
        processes = descendants(run.process.pid)  # trainers: sessions of their own
        for process in processes:
            os.kill(process, signal.SIGSTOP)
        try:
            yield
        finally:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process, signal.SIGCONT)

    def lose_node(self, node: str) -> list[str]:
        """Freeze the processes of the pods on `node` (see the module's docstring); their pods' names."""
        with self._lock:
            self.lost_nodes.add(node)
            names = [name for name, run in self.running.items() if run.node == node]
            for name in names:
                run = self.running.pop(name)
                for process in (run.process.pid, *descendants(run.process.pid)):  # trainers: sessions of their own
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process, signal.SIGSTOP)
                self._frozen.append(run)
        return names

    def _report_exit(self, name: str, run: Running) -> None:
        code = run.process.returncode
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention, as the kubelet reports
        tail = self.log(name).encode()[-MESSAGE_BYTES:].decode(errors="replace")
        message = "\n".join(tail.splitlines()[-MESSAGE_LINES:]) if code else ""
        terminated = {"exitCode": code, "reason": "Error" if code else "Completed"} | (
            {"message": message} if message else {}
        )
        phase = "Failed" if code else "Succeeded"
        try:
            self._set_container_state(name, phase, run.container, {"terminated": terminated})
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            # deleted while its process ended (the operator removes a finished job's pods): nothing to report
        del self.running[name]

    def _set_container_state(self, name: str, phase: str, container: str, state: dict[str, Any]) -> None:
        container_status = {"name": container, "state": state, "ready": False, "restartCount": 0, "image": "",
                            "imageID": ""}  # fmt: skip
        status = {"phase": phase, "containerStatuses": [container_status]}
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def _end(self, name: str) -> None:
        """SIGTERM, SIGKILL after the pod's grace period; the pod counts as running until its process ended."""
        run = self.running[name]
        if run.process.poll() is None:
            # A child of the zygote may have ended and been reaped before the zygote's word of it arrived.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.process.pid, signal.SIGTERM)
            try:
                run.process.wait(timeout=run.grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.process.pid, signal.SIGKILL)
                run.process.wait()
        del self.running[name]

    def _start(self, pod: dict[str, Any]) -> None:
        name, spec = pod["metadata"]["name"], pod["spec"]
        container = spec["containers"][0]
        secrets = {s.metadata.name for s in self.core.list_namespaced_secret(self.namespace).items}
        missing = [s["name"] for s in spec.get("imagePullSecrets", []) if s["name"] not in secrets]
        if missing:
            message = f"Unable to retrieve some image pull secrets ({', '.join(missing)}); pull access denied"
            self._set_container_state(name, "Pending", container["name"],
                                      {"waiting": {"reason": "ErrImagePull", "message": message}})  # fmt: skip
            self._uids.add(pod["metadata"]["uid"])
            return
        home = self.directory / name
        home.mkdir(parents=True, exist_ok=True)
        services, unresolved = self._service_addresses()
        words = " ".join(container["command"] + container.get("args", []))
        if any(f"{service}:" in words for service in unresolved):
            return  # a Service it needs has no running pod yet (the rendezvous store): next round
        mounts = self._volumes(spec, container, home)
        ports = {p["containerPort"]: self._ports.setdefault((name, p["containerPort"]), free_port())
                 for p in container.get("ports", [])}  # fmt: skip

        def local(text: str) -> str:
            for path, folder in sorted(mounts.items(), key=lambda m: -len(m[0])):
                text = text.replace(path, str(folder))
            return re.sub(r"\b([a-z0-9-]+):(\d+)\b", lambda m: services.get(m.group(0), m.group(0)), text)

        command = [local(part) for part in container["command"] + container.get("args", [])]
        command = [sys.executable if part == "python" else part for part in command]
        if "largebatch_trainer.rendezvous" in command:
            command = [p for p in command if not p.startswith("--port=")]
            command += ["--host=127.0.0.1", f"--port={ports[next(iter(ports))]}"]
        env = {e["name"]: local(e["value"]) for e in container.get("env", [])}
        env |= {"LARGEBATCH_DEVICE": "cpu", "LARGEBATCH_METRICS_PORT": "0", "OMP_NUM_THREADS": "1"}
        if spec.get("serviceAccountName") and spec.get("automountServiceAccountToken", True):
            env["KUBECONFIG"] = str(self.cluster.kubeconfig_for(spec["serviceAccountName"], self.namespace, home))
        env |= {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH") if k in os.environ}
        (home / "tmp").mkdir(exist_ok=True)
        env["TMPDIR"] = str(home / "tmp")
        if command[:2] == [sys.executable, "-m"] and command[2] in zygote.MODULES:
            process = self._zygote.start(command[2], command[3:], env, home, home / "log")
        else:
            with open(home / "log", "ab") as log:
                process = subprocess.Popen(command, env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)  # fmt: skip
        grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self.running[name] = Running(
            pod["metadata"]["uid"], process, ports, pod["metadata"].get("labels", {}), grace,
            spec.get("restartPolicy") == "Never", container["name"], spec["nodeName"],
        )  # fmt: skip
        self.started.append(name)
        self._uids.add(pod["metadata"]["uid"])

    def _volumes(self, spec: dict[str, Any], container: dict[str, Any], home: Path) -> dict[str, Path]:
        folders: dict[str, Path] = {}
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                folder = home / volume["name"]
                folder.mkdir(exist_ok=True)
                data = self.core.read_namespaced_config_map(volume["configMap"]["name"], self.namespace).data
                for key, value in (data or {}).items():
                    (folder / key).write_text(value)
            elif "persistentVolumeClaim" in volume:
                folder = self.directory / f"pvc-{volume['persistentVolumeClaim']['claimName']}"
            else:
                folder = home / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            folders[volume["name"]] = folder
        return {m["mountPath"]: folders[m["name"]] for m in container.get("volumeMounts", []) if m["name"] in folders}

    def _service_addresses(self) -> tuple[dict[str, str], set[str]]:
        """(`service:port` → `127.0.0.1:local port` of a running pod its selector picks, the names of
        the Services with a selector but no such pod yet)."""
        addresses: dict[str, str] = {}
        unresolved: set[str] = set()
        for service in self.core.list_namespaced_service(self.namespace).items:
            selector = service.spec.selector or {}
            for port in service.spec.ports or []:
                target = port.target_port if isinstance(port.target_port, int) else port.port
                for run in self.running.values():
                    if selector and selector.items() <= run.labels.items() and target in run.ports:
                        addresses[f"{service.metadata.name}:{port.port}"] = f"127.0.0.1:{run.ports[target]}"
            if (
                selector
                and service.spec.cluster_ip != "None"
                and not any(a.startswith(f"{service.metadata.name}:") for a in addresses)
            ):
                unresolved.add(service.metadata.name)
        return addresses, unresolved

    def log(self, pod: str) -> str:
        path = self.directory / pod / "log"
        return path.read_text(errors="replace") if path.exists() else ""
