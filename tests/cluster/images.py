"""The project's images for the real node: a Docker engine as a local process, the two images built by
`make images` (dev/images.sh) on a Debian base made by dev/base_image.sh (no registry outside is
reachable), then loaded into the real node's containerd, as `kind load docker-image` loads a kind node.

No registry between them: pushing the trainer's 6 GB layer to a registry on loopback and pulling it back
took 15 minutes on a cold machine and kept a third copy of it on disk, and a cluster's pull is a step these
tests have nothing to learn from (a refused pull they still meet: an image that is not there).

What outlives a session, in the per-user cache (~/.cache/largebatch): dockerd's data (the base, and every
layer built, so a rebuild after a code change redoes only the project's layer) and containerd's root (an
image is loaded once per machine). The images' tag is a hash of the files they are built from, so a node
never runs an image older than the checkout; older tags are removed from both when a new one is built,
so the cache holds one build (about 20 GB with the trainer's CUDA torch in both stores).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.cluster import spawn, stop_groups
from tests.cluster.node import CACHE, PAUSE_IMAGE, RealNode, unmount_under
from tests.helpers import ROOT, wait_for

INPUTS = ("pyproject.toml", "constraints.txt", "operator", "trainer_image")
"""What the Dockerfiles copy (operator/Dockerfile and trainer_image/Dockerfile among them)."""

DOCKER_DATA = CACHE / "docker"
"""dockerd's data root: the base, torch's layer and the rest, kept from run to run."""


def checkout_tag() -> str:
    """The tests' tag for this checkout's images."""
    return f"test-{inputs_digest()}"


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
        return cls(spawn(command, log), log)

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
            f"--data-root={DOCKER_DATA}", f"--exec-root={directory / 'exec'}", f"-H=unix://{self.socket}",
            f"--pidfile={directory / 'dockerd.pid'}",
        ], directory / "dockerd.log")  # fmt: skip
        wait_for(lambda: self.daemon.alive() and self.run("version", check=False).returncode == 0,
                 what="dockerd answering")  # fmt: skip

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, check=check)

    def stop(self) -> None:
        self.daemon.stop()
        unmount_under(self.directory)  # dockerd's exec-root keeps a network namespace mounted


@dataclass(frozen=True)
class Images:
    operator: str  # repository:tag of the operator image
    trainer: str

    def __iter__(self):
        return iter((self.operator, self.trainer))

    @property
    def repository(self) -> str:
        return self.operator.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.operator.rsplit(":", 1)[1]


REPOSITORY = "largebatch.test"
"""Where the tests' images are named: a domain no pull reaches, so a node runs only what was loaded."""


def build(docker: Docker) -> Images:
    """`make images` with the debootstrap base as BASE, tagged from the inputs' hash; older test tags are
    removed (their layers go with them unless the new images share them)."""
    base = subprocess.run([str(ROOT / "dev" / "base_image.sh")], env=docker.env, capture_output=True, text=True)
    if base.returncode:
        raise RuntimeError(f"dev/base_image.sh failed:\n{base.stderr[-3000:]}")
    tag = checkout_tag()
    images = Images(f"{REPOSITORY}/operator:{tag}", f"{REPOSITORY}/trainer:{tag}")
    if all(docker.run("image", "inspect", image, check=False).returncode == 0 for image in images):
        return images
    env = docker.env | {"IMAGE_REPOSITORY": REPOSITORY, "IMAGE_TAG": tag, "BASE": base.stdout.strip(),
                        "BUILD_FLAGS": "--network host"}  # fmt: skip
    result = subprocess.run([str(ROOT / "dev" / "images.sh")], env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"dev/images.sh failed:\n{(result.stdout + result.stderr)[-5000:]}")
    listed = docker.run("image", "ls", "--format={{.Repository}}:{{.Tag}}", f"--filter=reference={REPOSITORY}/*")
    older = [image for image in listed.stdout.split() if image not in images]
    if older:
        docker.run("image", "rm", *older)
    docker.run("image", "prune", "--force")  # the untagged images of earlier builds' requirements stages
    return images


def load(images: Images, docker: Docker, node: RealNode) -> None:
    """Each image into the node's containerd unless it is there (`docker save | ctr images import`), then
    every other image out of it: the node's images are the tests' alone, and each older build holds
    gigabytes."""
    present = targets(node)
    for image in (image for image in images if image not in present):
        save = subprocess.Popen(["docker", "save", image], env=docker.env, stdout=subprocess.PIPE)
        imported = node.ctr("images", "import", "-", stdin=save.stdout, check=False)
        save.stdout.close()
        if save.wait() or imported.returncode:
            raise RuntimeError(f"loading {image} into the node failed: {imported.stderr.decode()[-2000:]}")
    remove_others(node, keep=[*images, PAUSE_IMAGE])
    LOADED.write_text(images.tag)


LOADED = CACHE / "node-images.tag"
"""The tag last loaded into the node: tests/conftest.py deals the lanes knowing whether the e2e-node lane
builds and loads the images first (`loaded`) without starting a daemon to ask."""


def loaded() -> bool:
    """Whether the node's containerd holds this checkout's images, as far as the last load says."""
    return LOADED.exists() and LOADED.read_text() == checkout_tag()


def readiness() -> str:
    """How far this machine is from running this checkout's images, for tests/conftest.py's dealing:
    "loaded"; "layers built" (Docker's data is there, whatever changed since: the project's layers are
    rebuilt and the images imported); or "cold" (no Docker data: the base and torch's layer to make)."""
    if loaded():
        return "loaded"
    return "layers built" if DOCKER_DATA.is_dir() else "cold"


def targets(node: RealNode) -> dict[str, str]:
    """Each image reference in the node's containerd and the manifest it names."""
    rows = [line.split() for line in node.ctr("images", "ls").stdout.decode().splitlines()[1:]]
    return {row[0]: row[2] for row in rows if row}


def remove_others(node: RealNode, keep: list[str]) -> None:
    """Every reference but `keep` and the CRI's own references to the same manifests (`sha256:<id>` and
    `name@sha256:<digest>`); containerd then collects the layers and snapshots no reference holds. An
    older tag of an unchanged image goes too: the CRI would report a pod's image by either name."""
    found = targets(node)
    kept = {found[reference] for reference in keep if reference in found}
    stale = [reference for reference, manifest in found.items()
             if reference not in keep and not (manifest in kept and _by_digest(reference))]  # fmt: skip
    if stale:
        node.ctr("images", "rm", "--sync", *stale)


def _by_digest(reference: str) -> bool:
    return reference.startswith("sha256:") or "@sha256:" in reference
