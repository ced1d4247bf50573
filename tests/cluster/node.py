"""A real node for the test control plane: a kubelet built from the control plane's own Kubernetes module,
running pods through Debian's containerd and runc, with the CNI bridge plugin for pod networking,
kube-proxy for Service addresses and CoreDNS for their names, all as local processes (as root).

Pods land on it only when they ask to: it carries the label `largebatch.io/node: real` and the taint
`largebatch.io/node=real:NoSchedule`; KWOK's fake nodes stay for the scale and scheduling tests.

What a node needs here that a cloud node has from its image (see README.md, "The real node"):
- An address the pods can reach: NODE_IP, the pods' bridge's own (these kernels have no dummy
  interfaces), made before the CNI plugin first uses the bridge. The API server advertises it (the
  `kubernetes` Service's endpoint, which kube-proxy routes pods to), CoreDNS listens on it.
- A pause image (the pod sandbox), built from tests/cluster/tools/pause and loaded into containerd.
- Its identity: a client certificate `system:node:<name>` in `system:nodes`, bound to the `system:node`
  role (the test API server authorizes by RBAC alone, without the Node authorizer).
- A root without CAP_SYS_RESOURCE (these machines' sandbox): containerd raises the OOM scores the
  kubelet asks for to its own (`restrict_oom_score_adj`).
- cgroup v1 (these machines' kernels mount v1 controllers): `failCgroupV1: false`, the cgroupfs driver
  (containerd 1.6 cannot tell the kubelet its driver) and no QoS cgroups.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster.cluster import Cluster, Pki, _name, spawn, stop_groups
from tests.helpers import free_port, wait_for

NAME = "real-0"
POD_CIDR = "10.244.0.0/24"
NODE_IP = "10.244.0.1"  # the pods' bridge's own address (their gateway): only this machine's pods reach it
CLUSTER_CIDR = "10.244.0.0/16"
BRIDGE = "lbtest-br0"
NETNS = Path("/var/run/netns")  # where containerd's CRI keeps the pods' network namespaces
LABEL = "largebatch.io/node"
TAINT = {"key": LABEL, "value": "real", "effect": "NoSchedule"}
TOLERATION = {"key": LABEL, "operator": "Equal", "value": "real", "effect": "NoSchedule"}
SELECTOR = {LABEL: "real"}
PAUSE_IMAGE = "largebatch.test/pause:1"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "largebatch"
"""What outlives a test session: containerd's root here, dockerd's data (images.py)."""
CONTAINERD = CACHE / "containerd"
"""containerd's root (images, snapshots) outlives a test session, so images are pulled once per machine."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclass
class RealNode:
    cluster: Cluster
    directory: Path = field(init=False)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory = self.cluster.directory / "node"

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    # --- start ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._netns = set(os.listdir(NETNS)) if NETNS.exists() else set()  # containerd's CNI adds its own
        self._network()
        self._containerd()
        self._load_pause_image()
        self._coredns()
        self._kube_proxy()
        self._kubelet()
        self.cluster.wait_condition(f"node/{NAME}", "Ready", timeout=120)

    def _network(self) -> None:
        ip("link", "del", BRIDGE, check=False)
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{NODE_IP}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        # Pod to Service to a pod on the same bridge: kube-proxy's rules must see bridged packets.
        Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1")
        cni = self.directory / "cni"
        cni.mkdir(exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "largebatch-test",
            "plugins": [
                {
                    "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}],
                             "dataDir": str(self.directory / "ipam")},
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }  # fmt: skip
        (cni / "10-largebatch.conflist").write_text(json.dumps(conflist, indent=1))

    def _containerd(self) -> None:
        CONTAINERD.mkdir(parents=True, exist_ok=True)
        config = f"""version = 2
root = "{CONTAINERD}"
state = "{self.directory / "containerd-state"}"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The kubelet asks for negative OOM scores (-998 for the sandbox), which needs CAP_SYS_RESOURCE, and
  # these machines' root lacks it (runc: "failed to update /proc/self/oom_score_adj: Permission
  # denied"): scores are raised to containerd's own instead.
  restrict_oom_score_adj = true
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{self.cluster.bin}/cni"
  conf_dir = "{self.directory / "cni"}"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""
        (self.directory / "containerd.toml").write_text(config)
        self._spawn("containerd", ["containerd", f"--config={self.directory / 'containerd.toml'}"])
        wait_for(lambda: self.ctr("version", check=False).returncode == 0, what="containerd answering")
        # A session killed before it stopped its node left containers in the cached root, of pods the new
        # kubelet does not know.
        remove_containers(self.socket)

    def ctr(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return ctr(self.socket, *args, check=check, **kw)

    def _load_pause_image(self) -> None:
        if PAUSE_IMAGE in self.ctr("images", "ls", "-q").stdout.decode().split():
            return
        archive = self.directory / "pause.tar"
        _oci_archive(self.cluster.bin / "pause", PAUSE_IMAGE, archive)
        self.ctr("images", "import", str(archive))

    def _coredns(self) -> None:
        corefile = self.directory / "Corefile"
        # Reverse names too, as a cluster's CoreDNS serves them (c10d looks its peers' names up).
        corefile.write_text(f"""cluster.local:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    errors
    kubernetes cluster.local in-addr.arpa {{
        kubeconfig {self.cluster.kubeconfig}
        pods insecure
    }}
    cache 5
}}
.:53 {{
    bind {NODE_IP}
    errors
}}
""")
        self._spawn("coredns", [str(self.cluster.bin / "coredns"), "-conf", str(corefile)])

    def _kube_proxy(self) -> None:
        kubeconfig = self._client_kubeconfig("kube-proxy", _name("system:kube-proxy"))
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": CLUSTER_CIDR,
            "hostnameOverride": NAME,
            "bindAddress": NODE_IP,
            "healthzBindAddress": "",
            "metricsBindAddress": "",
            # Leave the machine's conntrack settings alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        path = self.directory / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [str(self.cluster.bin / "kube-proxy"), f"--config={path}"])

    def _kubelet(self) -> None:
        self.cluster.kubectl("create", "clusterrolebinding", "largebatch-test-nodes", "--clusterrole=system:node",
                             "--group=system:nodes", check=False)  # fmt: skip
        kubeconfig = self._client_kubeconfig("kubelet", _name(f"system:node:{NAME}", "system:nodes"))
        root = self.directory / "kubelet"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"x509": {"clientCAFile": self.cluster.pki.path("ca.crt")},
                               "webhook": {"enabled": True}, "anonymous": {"enabled": False}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [NODE_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": str(self._resolv_conf()),
            "registerWithTaints": [TAINT],
            # The machine's disk is shared with everything else: never evict or collect images for it.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "volumePluginDir": str(root / "volume-plugins"),
            "podLogsDir": str(self.directory / "pod-logs"),
        }  # fmt: skip
        path = self.directory / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kubelet", [
            str(self.cluster.bin / "kubelet"), f"--config={path}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={root}", f"--cert-dir={root / 'pki'}", f"--hostname-override={NAME}",
            f"--node-ip={NODE_IP}", f"--node-labels={LABEL}=real", "--v=1",
        ])  # fmt: skip

    def _resolv_conf(self) -> Path:
        """The upstream resolver for pods' names outside the cluster: none here (no network)."""
        path = self.directory / "resolv.conf"
        path.write_text(f"nameserver {NODE_IP}\n")
        return path

    def _client_kubeconfig(self, name: str, subject) -> Path:
        pki: Pki = self.cluster.pki
        pki.issue(name, subject, client=True)
        return pki.kubeconfig(name, self.cluster.server, self.directory / f"{name}.kubeconfig")

    def _spawn(self, name: str, command: list[str]) -> None:
        self.processes[name] = spawn(command, self.directory / f"{name}.log")

    # --- stop -------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """The node's pods first, deleted through the API so that the kubelet stops their sandboxes (their
        network namespaces and mounts go with them); then the kubelet, whatever containers are left,
        the other processes, kube-proxy's rules, the bridge and any mount left under the node's folder."""
        if "kubelet" in self.processes:
            self._drain()
        kubelet = self.processes.pop("kubelet", None)
        if kubelet:
            stop_groups([kubelet.pid])
            kubelet.wait()
        if "containerd" in self.processes:
            remove_containers(self.socket)
        stop_groups([p.pid for p in self.processes.values()])
        for process in self.processes.values():
            process.wait()
        self.processes.clear()
        clean_host(self.cluster.bin)
        unmount_under(self.directory)
        for name in set(os.listdir(NETNS)) - self._netns if NETNS.exists() else ():
            unmount_under(NETNS / name)
            (NETNS / name).unlink(missing_ok=True)

    def _drain(self) -> None:
        on_node = ("--all-namespaces", f"--field-selector=spec.nodeName={NAME}")
        self.cluster.kubectl("delete", "pods", *on_node, "--grace-period=0", "--wait=false", check=False)
        try:
            wait_for(lambda: not self.cluster.kubectl("get", "pods", *on_node, "-o", "name").stdout.strip(),
                     timeout=60, what="the real node's pods gone")  # fmt: skip
        except AssertionError:
            pass  # what is left, containerd and the mounts' clean-up below remove

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")


def ctr(socket: Path, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", f"--address={socket}", "--namespace=k8s.io", *args], capture_output=True,
                          check=check, **kw)  # fmt: skip


def remove_containers(socket: Path) -> None:
    """Kill every task of the kubelet's namespace and remove its containers (the kubelet is gone)."""
    for container in ctr(socket, "containers", "ls", "-q").stdout.decode().split():
        ctr(socket, "tasks", "kill", "-s", "SIGKILL", container, check=False)
    for container in ctr(socket, "containers", "ls", "-q").stdout.decode().split():
        ctr(socket, "tasks", "delete", "-f", container, check=False)
        ctr(socket, "containers", "delete", container, check=False)


def unmount_under(path: Path) -> None:
    """Unmount every mount at or below `path`, deepest first (what a stopped kubelet, containerd or
    dockerd leaves: volumes, sandboxes' /dev/shm, the kubelet's own root)."""
    root = os.path.realpath(path)  # mountinfo names real paths (/var/run is /run)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # octal escapes: \040 is a space
        if point == root or point.startswith(root + "/"):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True)


def clean_host(bin: Path) -> None:
    """kube-proxy's and the kubelet's iptables chains (KUBE-*) and the pods' bridge."""
    subprocess.run([str(bin / "kube-proxy"), "--cleanup"], capture_output=True)
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = subprocess.run([tool, "-t", table, "-S"], capture_output=True, text=True).stdout.splitlines()
            for rule in rules:  # the jumps into them from the built-in chains, then the chains
                if rule.startswith("-A ") and not rule.split()[1].startswith("KUBE-") and " -j KUBE-" in rule:
                    subprocess.run([tool, "-t", table, "-D", *shlex.split(rule)[1:]], capture_output=True)
            chains = [rule.split()[1] for rule in rules if rule.startswith("-N KUBE-")]
            for flag in ("-F", "-X"):
                for chain in chains:
                    subprocess.run([tool, "-t", table, flag, chain], capture_output=True)
    ip("link", "del", BRIDGE, check=False)


def _oci_archive(binary: Path, reference: str, archive: Path) -> None:
    """A one-layer image holding `binary` as /pause, in the docker-archive layout `ctr images import`
    reads (no registry, no image builder needed)."""
    import hashlib
    import io

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        tar.add(binary, arcname="pause")
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()  # fmt: skip
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(archive, "w") as tar:
        for name, data in (("layer.tar", layer_bytes), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
