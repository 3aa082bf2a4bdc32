"""Webhooks to the application, signed the Standard Webhooks way, as OpenAI signs its own.

Each POST carries `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64 HMAC-SHA256 of
id.timestamp.body>` under the `whsec_` secret, which the openai SDK's `client.webhooks.unwrap()` checks (300 s of
skew). A delivery that fails (no connection, a timeout, an answer that is not 2xx) is tried again with backoff until
its deadline; every try of one event carries the same id and a fresh timestamp. The application's answers are never
logged or passed on, only their status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from standardwebhooks import Webhook

from gateway.platform.event_log import log_event

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.25
LONGEST_RETRY_S = 4.0
TRY_TIMEOUT_S = 5.0


class WebhookSender:
    def __init__(self, url: str, secret: str) -> None:
        self._url = url
        self._signer = Webhook(secret)
        self._client = httpx.AsyncClient(timeout=TRY_TIMEOUT_S, follow_redirects=False)

    @staticmethod
    def event(event_type: str, data: dict[str, Any]) -> dict[str, Any]:
        """An event object as OpenAI sends it: id, object, created_at, type, data."""
        return {"id": f"evt_{secrets.token_hex(10)}", "object": "event", "created_at": int(time.time()), "type": event_type, "data": data}

    def signed_headers(self, event_id: str, body: str) -> dict[str, str]:
        now = datetime.now(tz=UTC)
        return {
            "content-type": "application/json",
            "webhook-id": event_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self._signer.sign(event_id, now, body),
        }

    async def deliver(self, event: dict[str, Any], deadline: float) -> bool:
        """POST `event` until the application answers 2xx or the loop clock passes `deadline`. True when delivered."""
        body = json.dumps(event, separators=(",", ":"))
        wait, tries = FIRST_RETRY_S, 0
        while True:
            tries += 1
            status: int | None = None
            try:
                answer = await self._client.post(self._url, content=body, headers=self.signed_headers(event["id"], body))
                status = answer.status_code
                if 200 <= status < 300:
                    log_event("webhook.delivered", type=event["type"], event_id=event["id"], tries=tries, status=status)
                    return True
            except httpx.HTTPError as error:
                log.info("webhook %s try %d failed: %s", event["id"], tries, type(error).__name__)
            left = deadline - asyncio.get_running_loop().time()
            if left <= wait:
                log_event("webhook.undelivered", type=event["type"], event_id=event["id"], tries=tries, status=status)
                return False
            await asyncio.sleep(wait)
            wait = min(2 * wait, LONGEST_RETRY_S)

    async def aclose(self) -> None:
        await self._client.aclose()
