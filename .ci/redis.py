"""Make sure Debian's Redis server is there for the hosts tier's head-loss tests (tox -e hosts).

Those tests keep the Ray cluster's GCS state in a Redis server they start themselves, on the
test network's bridge (Ray's GCS fault tolerance), never the package's own service. If
``redis-server`` is missing, this installs Debian's ``redis-server`` when running as root (as CI
does), and otherwise says exactly what to install. In CI (CI=true) a server that is still
missing fails the run; elsewhere the tests skip with the same message.
"""

from __future__ import annotations

import shutil
import sys

from debian_package import how, install, still_missing

HOW = how("redis-server")


def main() -> int:
    if shutil.which("redis-server"):
        print(f"redis-server: {shutil.which('redis-server')}")
        return 0
    if install("redis-server") and shutil.which("redis-server"):
        return 0
    return still_missing(f"redis-server: missing; the head-loss tests need it: {HOW}")


if __name__ == "__main__":
    sys.exit(main())
