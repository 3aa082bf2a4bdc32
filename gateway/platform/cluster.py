"""`gateway cluster`: the multi-replica topology on one machine, from Debian and PyPI packages.

    router (HAProxy) --> gateway replicas (sessions, Whisper, Piper) --> LLM router (HAProxy) --> LLM workers
                                   |  Redis: secrets, idempotency, rate limits, replica directory
                                   |  PostgreSQL (or one SQLite file): conversations

The LLM workers are gateways serving `/v1/completions` on their in-process engine (on GPUs, vLLM or
SGLang take their place: deploy/compose.yaml). The LLM router hashes the conversation id header, so a
conversation stays on the worker that caches its prefix; the front router balances sessions by least
connections, checks /healthz (a draining replica leaves the rotation) and retries a 503 (a full
replica) on another. Used by users trying the topology out and by tests/integration/test_cluster.py.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import BaseModel, Field

from gateway.platform.processes import GatewayProcess, free_port

log = logging.getLogger("gateway.platform.cluster")

ROUTING_HEADER = "x-conversation-id"


def _wait_port(port: int, process: subprocess.Popen[bytes], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on {port} within {timeout_s:.0f} s")


def _stop(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class RedisServer:
    """redis-server on loopback, appending every write to its log in `folder` (a spent secret stays spent)."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "redis.log", "ab") as out:
            self.process = subprocess.Popen(
                [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.folder), "--save", "",
                 "--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "yes"],
                stdout=out, stderr=subprocess.STDOUT)
        _wait_port(self.port, self.process, "redis-server")
        return self

    def stop(self) -> None:
        _stop(self.process)


@dataclass
class PostgresServer:
    """A PostgreSQL cluster of its own (initdb) on loopback, trust authentication on 127.0.0.1 only."""

    folder: Path
    port: int = field(default_factory=free_port)
    bindir: Path | None = None

    @staticmethod
    def installed() -> Path | None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        return Path(found[-1]).parent if found else None

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run_as(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []  # initdb refuses to run as root

    def start(self) -> PostgresServer:
        self.bindir = self.installed()
        if self.bindir is None:
            raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._run_as():
            shutil.chown(self.folder, "postgres")
            if subprocess.run([*self._run_as(), "test", "-w", str(self.folder)]).returncode != 0:
                # The postgres user cannot reach the folder (a parent is private to root): a folder it can.
                self.folder = Path(tempfile.mkdtemp(prefix="gateway-cluster-pg-"))
                shutil.chown(self.folder, "postgres")
                log.warning("PostgreSQL's data is in %s: the postgres user cannot write the data folder", self.folder)
        data = self.folder / "data"
        if not data.exists():
            subprocess.run([*self._run_as(), str(self.bindir / "initdb"), "-D", str(data), "--auth=trust", "-U",
                            "postgres"], check=True, capture_output=True)
        subprocess.run([*self._run_as(), str(self.bindir / "pg_ctl"), "-D", str(data), "-l", str(self.folder / "log"),
                        "-w", "-o", f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                        f"-c unix_socket_directories={self.folder}", "start"], check=True, capture_output=True)
        return self

    def stop(self) -> None:
        if self.bindir is not None:
            subprocess.run([*self._run_as(), str(self.bindir / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "fast",
                            "stop"], capture_output=True)


def haproxy_config(port: int, servers: dict[str, int], *, hash_header: str | None) -> str:
    """A router for gateway replicas (least connections, /healthz checks, a 503 retried on another) or, with
    `hash_header`, for LLM workers (consistent hashing on that header: a conversation keeps its worker)."""
    balance = f"balance hdr({hash_header})\n    hash-type consistent" if hash_header else "balance leastconn"
    lines = "\n".join(f"    server {name} 127.0.0.1:{server_port} check inter 1s fall 2 rise 1"
                      for name, server_port in servers.items())
    if not hash_header:
        # Sticky by id: a call's hangup, a sideband connection, a resume and a GPT-Live session's sideband and
        # hangup go to the replica their id names (server names are the replica ids); the gateway forwards what
        # reaches another one anyway.
        lines = "\n".join(
            f"    use-server {name} if {{ path_beg /v1/realtime/calls/rtc_{name}_ }} || "
            f"{{ url_param(call_id) -m beg rtc_{name}_ }} || {{ url_param(resume) -m beg {name}. }} || "
            f"{{ path_beg /v1/live/sessions/sess_{name}_ }}"
            for name in servers) + "\n" + lines
    return f"""global
    maxconn 4096

defaults
    mode http
    timeout connect 3s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    option redispatch
    retries 2
    retry-on conn-failure empty-response 503

frontend entry
    bind 127.0.0.1:{port}
    default_backend pool

backend pool
    {balance}
    option httpchk GET /healthz
    http-check expect status 200
{lines}
"""


@dataclass
class HAProxy:
    folder: Path
    name: str
    servers: dict[str, int]
    hash_header: str | None = None
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HAProxy:
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(binary).exists():
            raise RuntimeError("haproxy is not installed (Debian: apt-get install haproxy)")
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / f"{self.name}.cfg"
        config.write_text(haproxy_config(self.port, self.servers, hash_header=self.hash_header))
        with open(self.folder / f"{self.name}.log", "ab") as out:
            self.process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT)
        _wait_port(self.port, self.process, f"haproxy ({self.name})")
        return self

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until the router answers /healthz through a checked server."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"haproxy ({self.name}) has no healthy server")

    def stop(self) -> None:
        _stop(self.process, signal.SIGUSR1)  # HAProxy's graceful stop


@dataclass
class Cluster:
    """`replicas` gateways in front of `workers` LLM workers, with Redis, PostgreSQL and two routers."""

    folder: Path
    replicas: int = 2
    workers: int = 2
    voice: bool = True
    port: int | None = None
    replica_args: list[str] = field(default_factory=list)  # more `gateway serve` options for the replicas
    redis: RedisServer | None = None
    database_url: str | None = None
    postgres: PostgresServer | None = None
    worker_processes: list[GatewayProcess] = field(default_factory=list)
    replica_processes: list[GatewayProcess] = field(default_factory=list)
    llm_router: HAProxy | None = None
    router: HAProxy | None = None

    def start(self) -> Cluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.redis = RedisServer(self.folder / "redis").start()
        if PostgresServer.installed() is not None:
            self.postgres = PostgresServer(self.folder / "postgres").start()
            self.database_url = self.postgres.url
        else:  # one SQLite file for every replica: fine on one machine, PostgreSQL beyond it
            self.database_url = f"sqlite+aiosqlite:///{self.folder / 'conversations.db'}"
            log.warning("PostgreSQL is not installed: the replicas share one SQLite file")
        self.worker_processes = [
            # The replicas screen what reaches the workers and what comes back; screened twice, text waits twice.
            GatewayProcess(self.folder / f"worker-{n}" / "gateway.log",
                           args=["--no-load-voice-models", "--no-safety"]).start()
            for n in range(self.workers)]
        for worker in self.worker_processes:
            worker.wait_ready(300)
        self.llm_router = HAProxy(self.folder / "routers", "llm", {f"worker{n}": w.port for n, w in
                                                                 enumerate(self.worker_processes)},
                                  hash_header=ROUTING_HEADER).start()
        for n in range(self.replicas):
            port = free_port()
            args = ["--llm-backend", f"{self.llm_router.url}/v1", "--llm-routing-header", ROUTING_HEADER,
                    "--redis-url", self.redis.url, "--database-url", self.database_url, "--replica-id", f"r{n}",
                    "--replica-url", f"http://127.0.0.1:{port}", *([] if self.voice else ["--no-load-voice-models"]),
                    *self.replica_args]
            self.replica_processes.append(GatewayProcess(self.folder / f"replica-{n}" / "gateway.log", port=port,
                                                         args=args).start())
        for replica in self.replica_processes:
            replica.wait_ready(300)
        self.router = HAProxy(self.folder / "routers", "gateway", {f"r{n}": r.port for n, r in
                                                                  enumerate(self.replica_processes)},
                              port=self.port or free_port()).start()
        self.router.wait_healthy()

    def stop(self) -> None:
        for part in (self.router, *self.replica_processes, self.llm_router, *self.worker_processes, self.postgres,
                     self.redis):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ClusterCommand(BaseModel):
    """Start gateway replicas, LLM workers, Redis, PostgreSQL and two HAProxy routers on this machine."""

    replicas: int = Field(2, ge=1, le=16, description="Gateway replicas (sessions, Whisper, Piper).")
    workers: int = Field(2, ge=1, le=16, description="LLM workers (gateways serving /v1/completions).")
    port: int = Field(8000, ge=1, le=65535, description="The router's port: the one URL clients use.")
    data_dir: Path | None = Field(None, description="Logs, Redis and PostgreSQL data (default: a temporary folder).")
    voice: bool = Field(True, description="Load Whisper and Piper in the replicas (--no-voice: text only).")

    def cli_cmd(self) -> None:
        folder = self.data_dir or Path(tempfile.mkdtemp(prefix="gateway-cluster-"))
        cluster = Cluster(folder, replicas=self.replicas, workers=self.workers, voice=self.voice, port=self.port)
        stop = False

        def _signal(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _signal)
        try:
            try:
                cluster.start()
            except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
                raise SystemExit(f"gateway cluster: {exc}") from None
            print(f"gateway cluster: {cluster.router.url if cluster.router else ''} ({self.replicas} replicas, "
                  f"{self.workers} LLM workers; logs in {folder}); Ctrl-C stops it", flush=True)
            while not stop:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()
