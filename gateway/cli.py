"""`gateway serve [options]`: every option is also a GATEWAY_* environment variable."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from pydantic import BaseModel, ValidationError, field_validator
from pydantic_settings import CliApp, CliSettingsSource, CliSubCommand, SettingsConfigDict

from gateway.api.http_server import guarded_protocol
from gateway.bench.cli import Bench
from gateway.platform import event_log
from gateway.platform.cluster import ClusterCommand
from gateway.platform.config import Settings, is_loopback
from gateway.platform.log_redaction import RedactKeys
from gateway.safety.detectors import load_denylist
from gateway.safety.hooks import load_classifier
from gateway.safety.log_filter import log_filters

if TYPE_CHECKING:
    from gateway.api.session_registry import SessionRegistry

log = logging.getLogger("gateway")


class Serve(Settings):
    """Start the gateway (HTTP, WebSocket and WebRTC on one port)."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", cli_kebab_case=True, cli_implicit_flags=True, extra="ignore")

    # The safety layer sits above the settings (platform/): its files are checked here, as the options are read,
    # so that a bad one is refused as the others are (one line, exit 2) rather than when the app is built.
    @field_validator("safety_denylist")
    @classmethod
    def _denylist(cls, value: Path | None) -> Path | None:
        if value is not None:
            load_denylist(value)  # DenylistError (a ValueError): unreadable, or a bad expression
        return value

    @field_validator("safety_classifier")
    @classmethod
    def _classifier(cls, value: str | None) -> str | None:
        if value is not None:
            load_classifier(value, None, 1.0)  # ValueError: neither a URL nor a loadable entry point
        return value

    def cli_cmd(self) -> None:
        serve(Settings.model_validate(self.model_dump()))


class Gateway(BaseModel):
    """Realtime voice and text gateway: OpenAI Realtime API and Chat Completions on local models."""

    serve: CliSubCommand[Serve]
    bench: CliSubCommand[Bench]
    cluster: CliSubCommand[ClusterCommand]

    def cli_cmd(self) -> None:
        CliApp.run_subcommand(self)


def serve(settings: Settings) -> None:
    uvicorn_log_config = event_log.configure(
        level=settings.log_level, log_format=settings.log_format, log_content=settings.log_content,
        filters=log_filters(RedactKeys([*settings.api_keys, *settings.sip_passwords().values()]),
                            settings.safety_phone_region))
    if not settings.api_keys:
        if not is_loopback(settings.host) and not settings.allow_unauthenticated_public_bind:
            sys.exit(
                f"refusing to bind {settings.host} with no API key: set --api-keys (GATEWAY_API_KEYS), "
                "bind 127.0.0.1, or pass --allow-unauthenticated-public-bind"
            )
        log.warning("no API key configured: anyone who can reach %s:%s can use the gateway", settings.host, settings.port)
    from gateway.api.app import build_app
    from gateway.api.services import services

    app = build_app(settings)
    scheme = "https" if settings.ssl_certfile else "http"
    log.info("gateway starting on %s://%s:%s (page at /, API under /v1)", scheme, settings.host, settings.port)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
        ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        loop="uvloop",
        http=guarded_protocol(settings.http_head_timeout_s),  # httptools, with a deadline on request heads
        ws="websockets-sansio",
        # Bigger than the event cap, so an oversized event gets an `error` event rather than a close.
        ws_max_size=settings.max_event_bytes + 1024 * 1024,
        log_level=settings.log_level,
        log_config=uvicorn_log_config,
        access_log=False,  # the http.request event replaces it (route templates: no query strings)
        timeout_keep_alive=settings.http_keep_alive_s,
        timeout_graceful_shutdown=10,
    )
    server = DrainingServer(config, services(app).sessions, settings.drain_timeout_s)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn raises SIGINT again once it has shut down (as uvicorn.run, one line)
        log.info("stopped by SIGINT")
    else:
        if server.interrupted:  # SIGINT ignored since the start (a shell's background job): that raise did nothing
            log.info("stopped by SIGINT")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, except that SIGTERM first drains the gateway (SessionRegistry.drain: no new sessions, the
    replies in flight finish, the rest are handed off to another replica), then shuts down as uvicorn does.
    SIGINT (Ctrl-C), and a second SIGTERM, shut down at once."""

    def __init__(self, config: uvicorn.Config, sessions: SessionRegistry, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.sessions = sessions
        self.drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self.interrupted = False  # a SIGINT stopped it

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: it only schedules the drain on the loop, whose task ends in uvicorn's own exit.
        self.interrupted = self.interrupted or sig == signal.SIGINT
        if sig == signal.SIGTERM and self._loop is not None and self._drain is None and not self.should_exit:
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self._drain is None:
            log.info("SIGTERM: draining (at most %.0f s for the replies in flight)", self.drain_timeout_s)
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_exit(), name="drain")

    async def _drain_then_exit(self) -> None:
        try:
            await self.sessions.drain(self.drain_timeout_s)
        finally:
            super().handle_exit(signal.SIGTERM, None)


def main(argv: list[str] | None = None) -> None:
    source: CliSettingsSource[Gateway] = CliSettingsSource(
        Gateway,  # type: ignore[arg-type]  # a plain model holding the subcommands is what CliApp runs
        cli_prog_name="gateway",
        cli_kebab_case=True,
        cli_implicit_flags=True,
    )
    try:
        CliApp.run(Gateway, cli_args=_spread_list_options(argv if argv is not None else sys.argv[1:]),
                   cli_settings_source=source)
    except ValidationError as exc:  # a bad option value: one line each, as argparse says it, not a traceback
        for error in exc.errors(include_url=False):
            option = "--" + str(error["loc"][-1]).replace("_", "-") if error["loc"] else "gateway"
            print(f"gateway: {option}: {error['msg']} (got {error.get('input')!r})", file=sys.stderr)
        sys.exit(2)


def _spread_list_options(args: list[str]) -> list[str]:
    """`--compare a.json b.json` as users type it, into the `--compare a.json --compare b.json` the parser reads."""
    spread: list[str] = []
    index = 0
    while index < len(args):
        spread.append(args[index])
        if args[index] == "--compare":
            values = []
            while index + 1 < len(args) and not args[index + 1].startswith("-"):
                index += 1
                values.append(args[index])
            spread[-1:] = [part for value in values for part in ("--compare", value)] or ["--compare"]
        index += 1
    return spread
