"""Make sure iproute2's ip and tc are there for the hosts tier (tox -e hosts).

The tier builds its hosts from network namespaces, veth pairs and a bridge (ip) and slows
their links with netem (tc): if either is missing, this installs Debian's package when running
as root (as CI does), and otherwise says exactly what to install. In CI (CI=true) a tool that
is still missing fails the run; elsewhere the tier's tests skip with the same message.
"""

from __future__ import annotations

import shutil
import sys

from debian_package import how, install, still_missing

TOOLS = ("ip", "tc")
HOW = how("iproute2")


def missing() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def main() -> int:
    if not missing():
        print("iproute2: " + ", ".join(str(shutil.which(tool)) for tool in TOOLS))
        return 0
    if install("iproute2") and not missing():
        return 0
    return still_missing(
        f"iproute2: {', '.join(missing())} missing; the hosts tier needs them: {HOW}"
    )


if __name__ == "__main__":
    sys.exit(main())
