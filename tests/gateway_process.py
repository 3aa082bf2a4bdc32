"""Start the real gateway as a subprocess for tests (the launcher the benchmarks use too)."""

from __future__ import annotations

from pathlib import Path

from gateway.platform.processes import GatewayProcess

__all__ = ["GatewayProcess", "start_gateway"]


def start_gateway(*args: str, log_path: Path, timeout_s: float = 240.0, port: int | None = None) -> GatewayProcess:
    """A ready gateway (/healthz 200) with `args` added to `gateway serve`; the caller stops it."""
    gateway = GatewayProcess(log_path, args=list(args), port=port).start()
    try:
        gateway.wait_ready(timeout_s)
    except BaseException:
        gateway.stop()
        raise
    return gateway
