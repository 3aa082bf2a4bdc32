"""Run Firefox ESR for Playwright's WebDriver BiDi driver, answering the one command ESR lacks.

    python tests/e2e/firefox_bidi_relay.py /usr/bin/firefox-esr [firefox arguments...]

Playwright (1.65) drives a stock Firefox over WebDriver BiDi (`channel="moz-firefox"`), but it
targets current Firefox releases: every new browser context sends
`emulation.setMediaFeaturesOverride`, which Firefox ESR 153 answers with "unknown command", and
the launch fails. browser_scenario.py therefore gives Playwright this script (through a small sh
wrapper) as Firefox's executable. It starts Firefox with the same arguments, passes its output
through, and puts a WebSocket relay on 127.0.0.1 in front of Firefox's BiDi endpoint (the
"WebDriver BiDi listening on ws://..." line Playwright reads is rewritten to the relay's address).
The relay forwards every message unchanged, except `emulation.setMediaFeaturesOverride` calls that
override nothing (all features null or absent, which is what Playwright sends for the defaults):
those it answers with success itself. Any other use of that command gets an honest error.

Firefox's exit ends the relay with the same status; SIGTERM/SIGINT are passed on to Firefox.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from typing import Any

import websockets

LISTENING = re.compile(r"WebDriver BiDi listening on (ws://\S+)")
PATCHED_METHOD = "emulation.setMediaFeaturesOverride"


def local_answer(raw: str | bytes) -> str | None:
    """The reply the relay gives itself to a client message, or None to forward it."""
    if PATCHED_METHOD.encode() not in (raw if isinstance(raw, bytes) else raw.encode()):
        return None
    try:
        message: dict[str, Any] = json.loads(raw)
    except ValueError:
        return None
    if message.get("method") != PATCHED_METHOD:
        return None
    features = (message.get("params") or {}).get("features") or {}
    if all(value is None for value in features.values()):
        return json.dumps({"type": "success", "id": message.get("id"), "result": {}})
    return json.dumps(
        {
            "type": "error",
            "id": message.get("id"),
            "error": "unsupported operation",
            "message": f"{PATCHED_METHOD} with {features} is not supported by this Firefox (relay)",
        }
    )


async def relay(client: Any, upstream_base: str) -> None:
    path = client.request.path if client.request is not None else "/session"
    async with websockets.connect(upstream_base + path, max_size=None, ping_interval=None) as upstream:

        async def to_firefox() -> None:
            async for raw in client:
                answer = local_answer(raw)
                if answer is None:
                    await upstream.send(raw)
                else:
                    await client.send(answer)

        async def to_client() -> None:
            async for raw in upstream:
                await client.send(raw)

        tasks = [asyncio.create_task(to_firefox()), asyncio.create_task(to_client())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # a closed socket on either side is the end


async def main(argv: list[str]) -> int:
    firefox = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE, limit=1 << 24)

    def pass_on(sig: int) -> None:
        if firefox.returncode is None:
            firefox.send_signal(sig)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pass_on, sig)
    server = None
    assert firefox.stderr is not None
    while line := await firefox.stderr.readline():
        text = line.decode(errors="replace")
        match = LISTENING.search(text)
        if match and server is None:
            upstream = match.group(1).rstrip("/")

            async def handler(client: Any, upstream: str = upstream) -> None:
                await relay(client, upstream)

            server = await websockets.serve(handler, "127.0.0.1", 0, max_size=None, ping_interval=None)
            port = next(iter(server.sockets)).getsockname()[1]
            text = text.replace(match.group(1), f"ws://127.0.0.1:{port}")
        sys.stderr.write(text)
        sys.stderr.flush()
    code = await firefox.wait()
    if server is not None:
        server.close()
        await server.wait_closed()
    return code


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(asyncio.run(main(sys.argv[1:])))
