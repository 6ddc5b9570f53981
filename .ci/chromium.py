"""Make sure Debian's Chromium is there for the console's browser test (tox -e console).

Playwright drives the system's browser (no browser download is possible or wanted): if
/usr/bin/chromium is missing, this installs Debian's package when running as root (as CI
does), and otherwise says exactly what to install. In CI (CI=true) a browser that is still
missing fails the run; elsewhere the test skips with the same message.
"""

from __future__ import annotations

import os
import sys

from debian_package import how, install, still_missing

CHROMIUM = "/usr/bin/chromium"
HOW = how("chromium")
#: Another tox environment may be installing a package at the same moment (PostgreSQL's
#: server, .ci/postgresql.py): wait for apt's lock rather than fail.
APT = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]


def main() -> int:
    if os.path.exists(CHROMIUM):
        print(f"chromium: {CHROMIUM}")
        return 0
    if install("chromium") and os.path.exists(CHROMIUM):
        return 0
    return still_missing(
        f"chromium: {CHROMIUM} is missing; the console's browser test needs it: {HOW}"
    )


if __name__ == "__main__":
    sys.exit(main())
