"""A real Kubernetes control plane as local processes, the way controller-runtime's envtest runs one:
etcd, kube-apiserver (TLS, RBAC), kube-scheduler and kube-controller-manager with kubeconfigs of
their own, and KWOK, which plays the kubelet for fake nodes (GPU nodes with `nvidia.com/gpu`).

    python -m tests.cluster up [--dir .cluster] [--gpu-nodes 2] [--gpus-per-node 8] [--cpu-nodes 1]
    python -m tests.cluster down [--dir .cluster]
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.helpers import bound, free_port, wait_for

HERE = Path(__file__).resolve().parent
FAKE = "kwok.x-k8s.io/node"


def tools() -> Path:
    """Build the binaries and take the Prometheus Operator's CRDs if they are missing
    (tests/cluster/build_tools.sh), and return their folder."""
    out = subprocess.run([str(HERE / "build_tools.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


class CommandFailed(subprocess.CalledProcessError):
    """A failed kubectl or helm, with what it printed: pytest's summary shows only str(error)."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or self.stdout or '').strip()}"


def _run(command: list[str], check: bool, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, **kw)
    if check and result.returncode:
        raise CommandFailed(result.returncode, command, result.stdout, result.stderr)
    return result


# --- certificates ---------------------------------------------------------------------------------


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _certificate(subject: x509.Name, key, issuer_cert, issuer_key, *, ca=False, server_names=(), client=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server_names:
        names = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in server_names]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if not ca:
        usages = [x509.ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []
        usages += [x509.ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


@dataclass
class Pki:
    directory: Path

    def create(self) -> None:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        self.ca_key = _key()
        self.ca_cert = _certificate(_name("largebatch-test-ca"), self.ca_key, None, None, ca=True)
        self._write("ca", self.ca_key, self.ca_cert)
        serving_names = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "10.0.0.1",
            "10.244.0.1",  # tests/cluster/node.py's NODE_IP, where the real node's pods reach the API server
        ]
        self.issue("apiserver", _name("kube-apiserver"), server_names=serving_names)
        self.issue("admin", _name("admin", "system:masters"), client=True)
        self.issue("scheduler", _name("system:kube-scheduler"), client=True)
        self.issue("controller-manager", _name("system:kube-controller-manager"), client=True)
        self.issue("kwok", _name("kwok", "system:masters"), client=True)
        # The API server's own login to kubelets (logs, exec), as kubeadm's apiserver-kubelet-client.
        self.issue("apiserver-kubelet-client", _name("kube-apiserver-kubelet-client", "system:masters"), client=True)
        sa = _key()
        (d / "sa.key").write_bytes(_pem_key(sa))
        (d / "sa.pub").write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )

    def issue(self, name: str, subject: x509.Name, **kw) -> None:
        key = _key()
        self._write(name, key, _certificate(subject, key, self.ca_cert, self.ca_key, **kw))

    def _write(self, name: str, key, cert) -> None:
        (self.directory / f"{name}.key").write_bytes(_pem_key(key))
        (self.directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def path(self, name: str) -> str:
        return str(self.directory / name)

    def kubeconfig(self, user: str, server: str, path: Path) -> Path:
        def b64(name: str) -> str:
            return base64.b64encode((self.directory / name).read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate-data": b64(f"{user}.crt"), "client-key-data": b64(f"{user}.key")},
                }
            ],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        return path


# --- the cluster ----------------------------------------------------------------------------------


@dataclass
class Cluster:
    directory: Path
    bin: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    def start(
        self,
        gpu_nodes: int = 2,
        gpus_per_node: int = 8,
        cpu_nodes: int = 1,
        timeout: float = 60,
        real_node=None,
        reachable_from_pods: bool = False,
    ) -> None:
        """`real_node`: a callable given this cluster that starts a real node (tests/cluster/node.py)
        once the control plane runs; the API server then listens where that node's pods reach it, as it
        does with `reachable_from_pods`, for a real node added later (`add_real_node`)."""
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        self.pki = pki = Pki(d / "pki")
        pki.create()
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        self._spawn(
            "etcd",
            [
                "--name=test", f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}", f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=test=http://127.0.0.1:{peer_port}", "--unsafe-no-fsync",
            ],
        )  # fmt: skip
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{etcd_port}", f"--secure-port={api_port}",
                *self._addresses(bool(real_node) or reachable_from_pods), f"--cert-dir={d / 'apiserver-certs'}",
                f"--kubelet-client-certificate={pki.path('apiserver-kubelet-client.crt')}",
                f"--kubelet-client-key={pki.path('apiserver-kubelet-client.key')}",
                f"--tls-cert-file={pki.path('apiserver.crt')}", f"--tls-private-key-file={pki.path('apiserver.key')}",
                f"--client-ca-file={pki.path('ca.crt')}", "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki.path('sa.pub')}",
                f"--service-account-signing-key-file={pki.path('sa.key')}",
                "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
            ],
        )  # fmt: skip
        pki.kubeconfig("admin", self.server, self.kubeconfig)
        self._wait_ready(timeout)
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={pki.kubeconfig('controller-manager', self.server, d / 'cm.kubeconfig')}",
                "--leader-elect=false", "--use-service-account-credentials=true", "--secure-port=0",
                f"--service-account-private-key-file={pki.path('sa.key')}", f"--root-ca-file={pki.path('ca.crt')}",
                f"--cluster-signing-cert-file={pki.path('ca.crt')}", f"--cluster-signing-key-file={pki.path('ca.key')}",
            ],
        )  # fmt: skip
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={pki.kubeconfig('scheduler', self.server, d / 'scheduler.kubeconfig')}",
                "--leader-elect=false", "--secure-port=0",
            ],
        )  # fmt: skip
        pki.kubeconfig("kwok", self.server, d / "kwok.kubeconfig")
        self._spawn_kwok("fake")
        if real_node:
            self.add_real_node(real_node)
        for i in range(gpu_nodes):
            self.add_node(f"gpu-{i}", gpus=gpus_per_node)
        for i in range(cpu_nodes):
            self.add_node(f"cpu-{i}", gpus=0)
        self._write_pids()

    def add_real_node(self, real_node) -> None:
        """Starts the real node (`real_node(self)`): a machine has room for one, which the cluster whose
        API server listens where pods reach it (`start`'s `reachable_from_pods`) may add when a test first
        needs it."""
        self.node = real_node(self)
        self.node.start()
        self._write_pids()

    def _write_pids(self) -> None:
        """What `python -m tests.cluster down` stops, should a test run be killed: the control plane's
        processes and the real node's (their names differ)."""
        node = getattr(self, "node", None)
        processes = self.processes | (node.processes if node else {})
        (self.directory / "pids").write_text("\n".join(f"{n} {p.pid}" for n, p in processes.items()))

    @staticmethod
    def _addresses(reachable_from_pods: bool) -> list[str]:
        """Loopback only, unless a real node's pods must reach the API server: then on every address,
        advertised on the node's (the `kubernetes` Service's endpoint, where kube-proxy sends pods)."""
        if not reachable_from_pods:
            return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"]
        from tests.cluster.node import NODE_IP

        # The node registers its address; the API server reaches it there for logs (no DNS for node names).
        return [
            "--bind-address=0.0.0.0", f"--advertise-address={NODE_IP}", "--kubelet-preferred-address-types=InternalIP"
        ]  # fmt: skip

    def _spawn_kwok(self, nodes: str) -> None:
        """KWOK for the nodes annotated `FAKE=nodes`: "fake" for the shared one, a node's name for a node
        with a KWOK of its own (one that a test can lose)."""
        self._spawn(
            "kwok" if nodes == "fake" else f"kwok-{nodes}",
            [
                f"--kubeconfig={self.directory / 'kwok.kubeconfig'}",
                "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={FAKE}={nodes}",
                "--node-ip=10.1.0.1", "--cidr=10.2.0.0/16", f"--config={self.bin / 'kwok-stages.yaml'}",
            ],
            binary="kwok",
        )  # fmt: skip

    def _spawn(self, name: str, args: list[str], binary: str | None = None) -> None:
        self.commands[name] = [str(self.bin / (binary or name)), *args]
        self.processes[name] = spawn(self.commands[name], self.directory / f"{name}.log")

    @contextlib.contextmanager
    def stopped(self, name: str) -> Iterator[None]:
        """One component stopped (SIGTERM, as an upgrade of a control plane does) for as long as the block
        runs, then started again with the same flags (etcd keeps its data); returns once the API server
        answers /readyz again, which checks etcd too."""
        process = self.processes[name]
        stop_groups([process.pid])
        process.wait()
        try:
            yield
        finally:
            self.processes[name] = spawn(self.commands[name], self.directory / f"{name}.log")
            self._write_pids()
            self._wait_ready(timeout=180)  # a minute was short once, with ten jobs starting on two cores

    def kubectl(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return _run([str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], check, **kw)

    def wait_condition(self, resource: str, condition: str, timeout: float = 120) -> None:
        """Wait until `resource` (kind/name) has `condition` True. Polled rather than `kubectl wait`, whose
        watch failed at once on a busy machine (CI, stop 17) where a later read saw the condition hold."""
        status = f'jsonpath={{.status.conditions[?(@.type=="{condition}")].status}}'
        wait_for(
            lambda: self.kubectl("get", resource, "-o", status, check=False).stdout == "True",
            timeout,
            what=f"{resource} {condition}",
        )

    def wait_established(self, *crds: str) -> None:
        for name in crds:
            self.wait_condition(f"crd/{name}", "Established")

    def _wait_ready(self, timeout: float) -> None:
        timeout = bound(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {process.returncode}; see {self.directory / (name + '.log')}"
                    )
            if self.kubectl("get", "--raw=/readyz", check=False).returncode == 0:
                return
            time.sleep(0.2)
        checks = self.kubectl("get", "--raw=/readyz?verbose", check=False)
        failing = [line for line in (checks.stdout + checks.stderr).splitlines() if not line.startswith("[+]")]
        raise TimeoutError(f"kube-apiserver not ready after {timeout:.0f} s ({'; '.join(failing)}); see "
                           f"{self.directory}/kube-apiserver.log")  # fmt: skip

    def add_node(self, name: str, gpus: int = 0, cpu: str = "32", memory: str = "256Gi", losable: bool = False) -> None:
        """A fake node; `losable`: with a KWOK of its own, which `lose_node` stops."""
        allocatable = {"cpu": cpu, "memory": memory, "pods": "110"} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
        if losable:
            self._spawn_kwok(name)
            self._write_pids()
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {FAKE: name if losable else "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "largebatch.io/gpu": str(bool(gpus)).lower(),
                },
            },
            "spec": {"taints": [{"key": FAKE, "value": "fake", "effect": "NoSchedule"}]},
            "status": {"allocatable": allocatable, "capacity": allocatable},
        }
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
        self.wait_condition(f"node/{name}", "Ready")
        # The node-lifecycle controller taints a new node not-ready until it has seen it Ready.
        deadline = time.monotonic() + 30
        taints = ("get", f"node/{name}", "-o", "jsonpath={.spec.taints}")
        while "node.kubernetes.io/not-ready" in self.kubectl(*taints).stdout:
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {name} kept its not-ready taint")
            time.sleep(0.2)

    def remove_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--wait=true")
        self.lose_node(name)

    def lose_node(self, name: str) -> None:
        """Stop the KWOK of a `losable` node: its heartbeats stop, as a kubelet's do when its machine
        loses power or its network; the node-lifecycle controller takes it from there."""
        process = self.processes.pop(f"kwok-{name}", None)
        if process:
            stop_groups([process.pid])
            process.wait()
            self._write_pids()

    def token_for(self, service_account: str, namespace: str = "default") -> str:
        return self.kubectl("create", "token", service_account, "-n", namespace, "--duration=2h").stdout.strip()

    def kubeconfig_for(self, service_account: str, namespace: str, folder: Path) -> Path:
        """A kubeconfig in `folder` that acts as the ServiceAccount, with a token as in-cluster config would
        give a pod: whoever uses it has exactly that account's rights."""
        admin = yaml.safe_load(self.kubeconfig.read_text())
        context = {"cluster": "test", "user": service_account, "namespace": namespace}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": admin["clusters"][0]["cluster"]}],
            "users": [{"name": service_account, "user": {"token": self.token_for(service_account, namespace)}}],
            "contexts": [{"name": "sa", "context": context}],
            "current-context": "sa",
        }
        path = folder / f"{namespace}-{service_account}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run([str(self.bin / "helm"), f"--kubeconfig={self.kubeconfig}", *args], check)

    def stop(self) -> None:
        """Stop in reverse start order (the API server shuts down quickly only while etcd is up)."""
        if getattr(self, "node", None):
            self.node.stop()
        stop_groups([p.pid for p in self.processes.values()])
        for process in self.processes.values():
            process.wait()
        self.processes.clear()


def spawn(command: list[str], log: Path) -> subprocess.Popen:
    """Start a long-running helper in a process group of its own (stop_groups stops it and its children),
    its output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_groups(groups: list[int], grace: float = 10.0) -> None:
    """SIGTERM each process group, last started first, and SIGKILL what is still there after `grace`."""
    for group in reversed(groups):
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(group):
            time.sleep(0.1)
        if _alive(group):
            os.killpg(group, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; its parent has yet to reap it
