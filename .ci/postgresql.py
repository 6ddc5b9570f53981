"""Make sure Debian's PostgreSQL server is there for the job store's PostgreSQL tests (the
unit tier's tests/unit/service/test_store.py, run first in `tox -e core` and in `tox -e unit`).

The tests start a server of their own (initdb and pg_ctl on a unix socket in a temporary
directory, as the ``postgres`` user when run as root) and never use the package's own cluster.
If the server's programs are missing, this installs Debian's ``postgresql`` when running as
root (as CI does), and otherwise says exactly what to install. In CI (CI=true) a server that
is still missing fails the run; elsewhere the tests skip with the same message.
"""

from __future__ import annotations

import glob
import os
import pwd
import sys

from debian_package import how, install, still_missing

HOW = how("postgresql")
#: The server's programs the tests run, in Debian's versioned directory.
PROGRAMS = ("initdb", "pg_ctl", "postgres")


def missing() -> list[str]:
    """What the tests need and this machine lacks (empty: nothing)."""
    lacking = [p for p in PROGRAMS if not glob.glob(f"/usr/lib/postgresql/*/bin/{p}")]
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: the tests run it as the user the package makes.
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            lacking.append("the postgres user")
    return lacking


def main() -> int:
    lacking = missing()
    if not lacking:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1]
        print(f"postgresql: {os.path.dirname(found)}")
        return 0
    if install("postgresql"):
        lacking = missing()
        if not lacking:
            return 0
    return still_missing(
        f"postgresql: {', '.join(lacking)} missing; the job store's PostgreSQL tests need "
        f"Debian's server: {HOW}"
    )


if __name__ == "__main__":
    sys.exit(main())
