"""A virtual environment with this checkout installed the way a user installs it, `pip install largebatch`:
the core dependencies only, no extras, so no torch. The project's .venv has the [trainer,dev] extras,
where an import of torch (or of any other extra) that slipped into the operator goes unnoticed; tests
that run the operator as its image does (operator/Dockerfile) use this one instead
(tests/integration/test_operator_install.py).

Building it takes about 30 s, so it is kept in ~/.cache/largebatch/operator-venv-<key>, where the key
hashes pyproject.toml, every file of the two packages and the base interpreter: a change to any of
them builds a new one, which removes the older ones. A build goes into a folder of its own and is
published by renaming a symlink onto that name, atomically, so a killed build never leaves a half
venv behind (a venv's scripts name its python by absolute path, so the folder itself cannot move).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers import bound

ROOT = Path(__file__).resolve().parent.parent.parent
CACHE = Path.home() / ".cache" / "largebatch"
PREFIX = "operator-venv-"
# What `pip install <repo root>` reads: the metadata and the two packages (pyproject's packages.find).
FILES = ("pyproject.toml", "README.md")
PACKAGES = ("operator/largebatch", "trainer_image/largebatch_trainer")
# Variables that would put other packages on the path or send pip's install elsewhere.
UNSET = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV", "PIP_USER", "PIP_TARGET", "PIP_PREFIX")


def operator_python() -> Path:
    """The python of the cached venv that has this checkout installed without extras (built when missing)."""
    final = CACHE / f"{PREFIX}{source_key()}"
    python = final / "bin" / "python"
    if python.exists():  # only ever appears complete
        return python
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "operator-venv.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the lock goes with the process
        if not python.exists():  # another process may have built it meanwhile
            _build(final)
    return python


def clean_env() -> dict[str, str]:
    """The environment minus what would let packages from elsewhere into the venv's python."""
    return {key: value for key, value in os.environ.items() if key not in UNSET}


def source_key() -> str:
    digest = hashlib.sha256()
    digest.update(f"{base_python()} {sys.version}\0".encode())
    paths = [ROOT / "pyproject.toml"]
    for package in PACKAGES:
        paths += sorted(p for p in (ROOT / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in paths:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def base_python() -> Path:
    """The interpreter the running one was made from: a venv from it sees none of .venv's packages."""
    if sys.prefix == sys.base_prefix:
        return Path(sys.executable)
    base = getattr(sys, "_base_executable", "")
    if base and base != sys.executable and Path(base).is_file():
        return Path(base)
    cfg = (Path(sys.prefix) / "pyvenv.cfg").read_text().splitlines()
    settings = {key.strip(): value.strip() for key, _, value in (line.partition("=") for line in cfg)}
    home = Path(settings["home"])
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3", "python"):
        if (home / name).is_file():
            return home / name
    raise RuntimeError(f"no base interpreter in {home} (from {sys.prefix}/pyvenv.cfg)")


def _build(final: Path) -> None:
    build = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=CACHE))
    build.chmod(0o755)  # mkdtemp makes it 0700
    try:
        _run([str(base_python()), "-m", "venv", str(build)])
        with tempfile.TemporaryDirectory() as staged:
            # A copy of what the wheel is built from: pip builds in the tree it is given, and setuptools
            # would write build/ and *.egg-info into the checkout and reuse build/lib, deleted files included.
            for name in FILES:
                shutil.copy2(ROOT / name, Path(staged) / name)
            for package in PACKAGES:
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
                shutil.copytree(ROOT / package, Path(staged) / package, ignore=ignore)
            _run([str(build / "bin" / "python"), "-m", "pip", "install", "--quiet", staged])
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    link = CACHE / f".{final.name}.{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(build.name)
    if final.is_dir() and not final.is_symlink():
        shutil.rmtree(final)  # not one of ours (a venv without bin/python): os.replace can't take its place
    os.replace(link, final)  # atomic: the name now leads to a complete venv
    for old in CACHE.glob(f"{PREFIX}*"):
        # older keys' venvs, and folders of builds that were killed (we hold the lock: none is running)
        if old.is_symlink():
            if old != final:
                old.unlink()
        elif old != build:
            shutil.rmtree(old, ignore_errors=True)


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env=clean_env(), cwd=CACHE, timeout=bound(900))
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
