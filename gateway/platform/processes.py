"""Start the real gateway in a subprocess: for `gateway cluster`, the benchmarks and the tests.

`python -m gateway serve --host H --port P --ice-host-addresses 127.0.0.1 [extra args]`. The
caller's GATEWAY_* variables (GATEWAY_CACHE_DIR, GATEWAY_LLM_MODEL, ...) pass through unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository (gateway/platform/processes.py)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def get_json(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """(status, parsed body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.loads(error.read() or b"null")
        except ValueError:
            return error.code, None
    except (OSError, ValueError):
        return 0, None


class GatewayProcess:
    """One gateway subprocess on a free loopback port; `with GatewayProcess(log) as gw:` starts and stops it."""

    def __init__(
        self,
        log_path: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        ice_host_addresses: str = "127.0.0.1",
        data_dir: Path | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path)
        self.command = [
            sys.executable, "-m", "gateway", "serve",
            "--host", host, "--port", str(self.port), "--ice-host-addresses", ice_host_addresses,
            # Its own database beside its log, unless given: runs never share (or leave) conversations.
            "--data-dir", str(data_dir or self.log_path.parent / "gateway-data"),
            *(args or []),
        ]  # fmt: skip
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.health: dict[str, Any] | None = None
        self.health_statuses: set[int] = set()  # what /healthz answered while starting

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def start(self) -> GatewayProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()  # the child holds its own descriptor
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Poll /healthz until 200; raise with the log's tail if the gateway dies, fails or times out."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with code {self.process.returncode}:\n{self.log_tail()}")
            status, body = get_json(f"{self.url}/healthz")
            if status:
                self.health_statuses.add(status)
            if status == 200:
                self.health = body
                return body
            if isinstance(body, dict) and body.get("status") == "failed":
                raise RuntimeError(f"gateway failed to load its models: {body.get('error')}\n{self.log_tail()}")
            time.sleep(0.25)
        raise TimeoutError(f"gateway not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGINT first (uvicorn shuts down gracefully), then SIGTERM, then SIGKILL."""
        process = self.process
        if process is None or process.poll() is not None:
            return process.returncode if process else None
        for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 5.0)):
            process.send_signal(sig)
            try:
                return process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        process.kill()
        return process.wait()

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
