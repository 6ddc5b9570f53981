"""Make sure iproute2's ip and tc are there for the hosts tier (tox -e hosts).

The tier builds its hosts from network namespaces, veth pairs and a bridge (ip) and slows
their links with netem (tc): if either is missing, this installs Debian's package when running
as root (as CI does), and otherwise says exactly what to install. In CI (CI=true) a tool that
is still missing fails the run; elsewhere the tier's tests skip with the same message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

TOOLS = ("ip", "tc")
HOW = "sudo apt-get install -y --no-install-recommends iproute2"


def missing() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def main() -> int:
    if not missing():
        print("iproute2: " + ", ".join(str(shutil.which(tool)) for tool in TOOLS))
        return 0
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("iproute2: not installed; installing Debian's package", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "iproute2"], check=True, env=env
        )
        if not missing():
            return 0
    message = f"iproute2: {', '.join(missing())} missing; the hosts tier needs them: {HOW}"
    print(message, file=sys.stderr)
    return 1 if os.environ.get("CI", "").lower() in ("1", "true", "yes") else 0


if __name__ == "__main__":
    sys.exit(main())
