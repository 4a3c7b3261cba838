"""The base image `python:3.11-slim`: the real one when a registry gives it, else a stand-in.

Where no container registry is reachable (these machines reach Debian's mirrors and PyPI
only), debootstrap builds Debian bookworm with Python 3.11, pip, venv and the CA
certificates, which is what `python:3.11-slim` is (on Debian bookworm too). The root file
system is cached as a tarball under .cache/container/, so only the first run pays for it,
and is imported under the official name with a label saying it is a stand-in.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.container.engine import Engine, last_line

BASE = "docker.io/library/python:3.11-slim"
STAND_IN_LABEL = "org.claude-proxy.stand-in"
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
# What the official slim images leave out as well: package lists, caches and documentation.
TRIMMED = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
           "usr/share/info", "usr/share/locale")
IMAGE_CONFIG = ("ENV LANG=C.UTF-8", 'CMD ["python3"]')
RECIPE = repr((SUITE, MIRROR, PACKAGES, TRIMMED, IMAGE_CONFIG))
RECIPE_ID = hashlib.sha256(RECIPE.encode()).hexdigest()[:12]


class BaseImageError(Exception):
    """The base image can be neither pulled nor built here."""


def ensure_base(engine: Engine, cache: Path) -> str:
    """Make `python:3.11-slim` available to the engine; say where it came from."""
    pulled = engine("pull", BASE, timeout=600)
    if pulled.returncode == 0:
        return "the real python:3.11-slim, pulled from its registry"
    present = engine.inspect("image", BASE)
    labels = (present.get("Config") or {}).get("Labels") or {}
    if present and labels.get(STAND_IN_LABEL) == RECIPE_ID:
        return f"Debian {SUITE} stand-in, already imported (pull: {last_line(pulled)})"
    if present and STAND_IN_LABEL not in labels:
        return "python:3.11-slim as already present in the engine (pull failed)"
    tarball = cache / f"python-3.11-slim-stand-in-{RECIPE_ID}.tar"
    how = "cached tarball"
    if not tarball.exists():
        started = time.monotonic()
        build_root_tarball(tarball)
        how = f"debootstrap, {time.monotonic() - started:.0f} s"
    import_tarball(engine, tarball)
    return f"Debian {SUITE} stand-in ({how}) imported as python:3.11-slim"


def build_root_tarball(tarball: Path) -> None:
    """debootstrap a minimal bookworm with Python into a folder and pack it."""
    if shutil.which("debootstrap") is None:
        raise BaseImageError("python:3.11-slim cannot be pulled and debootstrap is not "
                             "installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise BaseImageError("python:3.11-slim cannot be pulled and debootstrap needs root")
    root = tarball.with_suffix(".rootfs")
    shutil.rmtree(root, ignore_errors=True)
    tarball.parent.mkdir(parents=True, exist_ok=True)
    command = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
               str(root), MIRROR]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise BaseImageError(f"debootstrap failed: {last_line(result)}")
    for relative in TRIMMED:
        for entry in (root / relative).glob("*"):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    partial = tarball.with_suffix(".partial")
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."],
                   check=True, timeout=600)
    partial.rename(tarball)
    shutil.rmtree(root)


def import_tarball(engine: Engine, tarball: Path) -> None:
    changes = [*IMAGE_CONFIG, f"LABEL {STAND_IN_LABEL}={RECIPE_ID}"]
    flags = [arg for change in changes for arg in ("--change", change)]
    result = engine("import", *flags, str(tarball), BASE, timeout=600)
    if result.returncode != 0:
        raise BaseImageError(f"{engine.name} import failed: {last_line(result)}")
