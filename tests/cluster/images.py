"""The project's images for the real node: a Docker engine and a registry on loopback as local processes,
and the two images built by `make images` (dev/images.sh) on a Debian base made by dev/base_image.sh
(no registry outside is reachable), then pushed to that registry, from which the real node's containerd
pulls them as a cluster's nodes pull from theirs.

What outlives a session, in the per-user cache (~/.cache/largebatch): dockerd's data (the base, and every
layer built, so a rebuild after a code change redoes only the project's layer) and the registry's storage
(a push then sends only the new layer). The images' tag is a hash of the files they are built from, so a
node never runs an image older than the checkout.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.cluster.cluster import stop_groups
from tests.cluster.node import unmount_under
from tests.helpers import ROOT, free_port, wait_for

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "largebatch"
INPUTS = ("pyproject.toml", "README.md", "constraints.txt", "operator", "trainer_image")
"""What the Dockerfiles copy (operator/Dockerfile and trainer_image/Dockerfile among them)."""


def inputs_digest() -> str:
    digest = hashlib.sha256()
    for top in INPUTS:
        path = ROOT / top
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass
class Daemon:
    """A long-running helper process with its log in `directory`."""

    process: subprocess.Popen
    log: Path

    @classmethod
    def spawn(cls, command: list[str], log: Path) -> Daemon:
        with open(log, "ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return cls(process, log)

    def stop(self) -> None:
        stop_groups([self.process.pid], grace=30)
        self.process.wait()

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.log.stem} exited ({self.process.returncode}):\n{self.log.read_text()[-3000:]}")
        return True


class Docker:
    """dockerd on a socket of its own (no bridge network, as these machines have none to spare)."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.socket = directory, directory / "docker.sock"
        self.env = dict(os.environ, DOCKER_HOST=f"unix://{self.socket}", DOCKER_BUILDKIT="0")
        self.daemon = Daemon.spawn([
            "dockerd", "--storage-driver=overlay2", "--iptables=false", "--ip6tables=false", "--bridge=none",
            f"--data-root={CACHE / 'docker'}", f"--exec-root={directory / 'exec'}", f"-H=unix://{self.socket}",
            f"--pidfile={directory / 'dockerd.pid'}",
        ], directory / "dockerd.log")  # fmt: skip
        wait_for(lambda: self.daemon.alive() and self.run("version", check=False).returncode == 0,
                 what="dockerd answering")  # fmt: skip

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, check=check)

    def stop(self) -> None:
        self.daemon.stop()
        unmount_under(self.directory)  # dockerd's exec-root keeps a network namespace mounted


class Registry:
    """docker-registry (distribution 2.8, Debian's package) on loopback, storage in the per-user cache."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.host = f"127.0.0.1:{free_port()}"
        config = {
            "version": 0.1,
            "storage": {"filesystem": {"rootdirectory": str(CACHE / "registry")}},
            "http": {"addr": self.host},
            "log": {"level": "warn"},
        }
        (directory / "registry.yaml").write_text(yaml.safe_dump(config))
        self.daemon = Daemon.spawn(["docker-registry", "serve", str(directory / "registry.yaml")],
                                   directory / "registry.log")  # fmt: skip
        wait_for(lambda: self.daemon.alive() and self._answers(), what="the registry answering")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.daemon.stop()


@dataclass(frozen=True)
class Images:
    operator: str  # repository:tag of the operator image, in the registry
    trainer: str

    @property
    def repository(self) -> str:
        return self.operator.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.operator.rsplit(":", 1)[1]


def build(docker: Docker, registry: Registry) -> Images:
    """`make images` with the registry as IMAGE_REPOSITORY, the debootstrap base as BASE, and PUSH=1."""
    base = subprocess.run([str(ROOT / "dev" / "base_image.sh")], env=docker.env, capture_output=True, text=True)
    if base.returncode:
        raise RuntimeError(f"dev/base_image.sh failed:\n{base.stderr[-3000:]}")
    tag = f"test-{inputs_digest()}"
    env = docker.env | {"IMAGE_REPOSITORY": f"{registry.host}/largebatch", "IMAGE_TAG": tag,
                        "BASE": base.stdout.strip(), "PUSH": "1", "BUILD_FLAGS": "--network host"}  # fmt: skip
    result = subprocess.run([str(ROOT / "dev" / "images.sh")], env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"dev/images.sh failed:\n{(result.stdout + result.stderr)[-5000:]}")
    repository = f"{registry.host}/largebatch"
    return Images(f"{repository}/operator:{tag}", f"{repository}/trainer:{tag}")
