"""A throwaway PostgreSQL server on loopback for the storage tests (Debian's `postgresql`; the tests that
use it are skipped when it is not installed)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throwaway cluster: initdb (as the postgres user when run as root), trust auth on 127.0.0.1 only."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if run_as:
        shutil.chown(folder, "postgres")
    data, port = folder / "data", free_port()
    subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres"],
                   check=True, capture_output=True)
    subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "-o",
                    f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder}", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
