"""Start the real gateway as a subprocess for tests and benchmarks, and wait until it is ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    health_statuses: set[int] = field(default_factory=set)  # what /healthz answered while starting

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_gateway(*args: str, log_path: Path, timeout_s: float = 240.0, env: dict[str, str] | None = None) -> GatewayProcess:
    port = free_port()
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--ice-host-addresses", "127.0.0.1", *args]
    log_file = log_path.open("wb")
    process = subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    gateway = GatewayProcess(process, port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{gateway.log_tail()}")
        try:
            status = httpx.get(f"{gateway.http_url}/healthz", timeout=2).status_code
            gateway.health_statuses.add(status)
            if status == 200:
                return gateway
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    gateway.stop()
    raise RuntimeError(f"gateway not ready in {timeout_s} s:\n{gateway.log_tail()}")
