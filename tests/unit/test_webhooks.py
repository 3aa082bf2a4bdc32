"""The webhooks' signature is the one the openai SDK checks; a delivery is retried until its deadline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import openai
import pytest

from gateway.platform.webhooks import WebhookSender

SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS13ZWJob29rcw=="


def test_the_sdk_unwraps_what_the_sender_signs_and_refuses_a_changed_body() -> None:
    sender = WebhookSender("http://127.0.0.1:9/hooks", SECRET)
    event = WebhookSender.event("realtime.call.incoming", {"call_id": "rtc_1", "sip_headers": [], "sip_media_security": "rtp"})
    body = json.dumps(event)
    headers = sender.signed_headers(event["id"], body)
    client = openai.OpenAI(api_key="unused", webhook_secret=SECRET, base_url="http://127.0.0.1:9/v1")
    unwrapped = client.webhooks.unwrap(body, headers)
    assert unwrapped.type == "realtime.call.incoming" and unwrapped.data.call_id == "rtc_1"  # type: ignore[union-attr]
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body.replace("rtc_1", "rtc_2"), headers)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body, {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) - 600)})


@pytest.fixture
def flaky_application() -> Iterator[tuple[str, list[str]]]:
    """Answers 503 twice, then 204; records each try's webhook-id."""
    ids: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            ids.append(self.headers["webhook-id"])
            self.send_response(503 if len(ids) <= 2 else 204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks", ids
    server.shutdown()
    server.server_close()


async def test_a_failed_delivery_is_tried_again_with_the_same_id(flaky_application: tuple[str, list[str]]) -> None:
    url, ids = flaky_application
    sender = WebhookSender(url, SECRET)
    event = WebhookSender.event("realtime.call.incoming", {"call_id": "rtc_1"})
    assert await sender.deliver(event, asyncio.get_running_loop().time() + 30)
    assert ids == [event["id"]] * 3
    await sender.aclose()


async def test_an_application_that_is_down_is_given_up_at_the_deadline() -> None:
    sender = WebhookSender("http://127.0.0.1:9/hooks", SECRET)  # nothing listens on the discard port
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await sender.deliver(WebhookSender.event("realtime.call.incoming", {}), started + 1.0)
    assert loop.time() - started < 5.0
    await sender.aclose()
