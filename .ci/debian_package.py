"""What the .ci scripts that make sure a Debian package is there share: installing it with
apt-get when running as root (as CI does), and the verdict when it is still missing (in CI,
CI=true, a failure; elsewhere the tests that need it skip with the same message)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: Another tox environment may be installing a package at the same moment (`tox p`): wait for
#: apt's lock rather than fail.
APT = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]


def how(package: str) -> str:
    """The command that installs ``package``, as the messages give it."""
    return f"sudo apt-get install -y --no-install-recommends {package}"


def install(package: str) -> bool:
    """Install Debian's ``package`` when running as root with apt-get; False when this cannot."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    print(f"{package}: not installed; installing Debian's package", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*APT, "update"], check=True, env=env)
    subprocess.run([*APT, "install", "-y", "--no-install-recommends", package], check=True, env=env)
    return True


def still_missing(message: str) -> int:
    """Say what is missing and what to install; the script's exit code (1 only in CI)."""
    print(message, file=sys.stderr)
    return 1 if os.environ.get("CI", "").lower() in ("1", "true", "yes") else 0
