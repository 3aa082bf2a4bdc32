"""One look at a remote LLM backend before the gateway reports ready: does it serve the model, and does it
take token-id prompts (the token flavour)? llama.cpp's server, for one, answers a token-id prompt with 500,
so a gateway left on the token flavour would fail every request.

- The token flavour refused, the chat flavour served: the gateway falls back to the chat flavour, with one
  log line that says so.
- The model not served (404 to both), the key refused (401/403), or neither flavour served:
  :class:`BackendMisconfigured`, one line that says what to set.
- The server unreachable or restarting (a worker that starts after its front): the configured flavour,
  with a warning; the breaker and retries of remote.py take it from there.

Blocking (httpx's sync client): it runs in the model loader's thread, never on an event loop.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import httpx

from .remote import RETRYABLE_STATUSES, RemoteConfig, redacted_body

log = logging.getLogger(__name__)
_SAY_HI = [{"role": "user", "content": "Hi"}]


class BackendMisconfigured(RuntimeError):
    """The backend cannot serve this gateway as configured; the message says what to change."""


def probe_backend(config: RemoteConfig, token_id: int) -> RemoteConfig:
    """`config`, with the flavour the server takes. `token_id`: any id of the model's vocabulary."""
    try:
        with httpx.Client(base_url=config.url.rstrip("/"), timeout=httpx.Timeout(
                config.read_timeout_s, connect=config.connect_timeout_s),
                headers={"authorization": f"Bearer {config.api_key}"} if config.api_key else {}) as http:
            return _probe(http, config, token_id)
    except httpx.TransportError as exc:
        log.warning("could not probe the LLM backend at %s (%s): using the %s flavour as configured", config.url,
                    type(exc).__name__, config.flavour)
        return config


def _probe(http: httpx.Client, config: RemoteConfig, token_id: int) -> RemoteConfig:
    one_token = {"model": config.model, "max_tokens": 1, "temperature": 0.0}
    if config.flavour == "token":
        tokens = http.post("/completions", json={**one_token, "prompt": [token_id]})
        if tokens.status_code == 200 or _transient(tokens, config):
            return config
        _refuse_access(tokens, config)
    chat = http.post("/chat/completions", json={**one_token, "messages": _SAY_HI})
    if chat.status_code == 200:
        if config.flavour == "token":
            log.warning("the LLM backend at %s takes no token-id prompts (it answered %d): using the chat flavour "
                        "(--llm-backend-flavour chat says so at start)", config.url, tokens.status_code)
        return replace(config, flavour="chat")
    if _transient(chat, config):
        return config
    _refuse_access(chat, config)
    log.warning("the LLM backend answered %d to a chat completion: %s", chat.status_code, redacted_body(chat.content))
    served = _served(http)
    if chat.status_code == 404 or (served and config.model not in served):
        listed = f" (it serves: {', '.join(served[:5])})" if served else ""
        raise BackendMisconfigured(f"The LLM backend at {config.url} does not serve the model {config.model!r}{listed}: "
                                   "set --llm-backend-model to the name it serves.")
    tried = "token-id completions or chat completions" if config.flavour == "token" else "chat completions"
    raise BackendMisconfigured(
        f"The LLM backend at {config.url} does not serve {tried} (it answered {chat.status_code}): "
        "point --llm-backend at an OpenAI-compatible server's /v1.")


def _transient(answer: httpx.Response, config: RemoteConfig) -> bool:
    """Restarting or busy: nothing to learn now."""
    if answer.status_code not in RETRYABLE_STATUSES and answer.status_code != 429:
        return False
    log.warning("the LLM backend at %s answered its probe with %d: using the %s flavour as configured", config.url,
                answer.status_code, config.flavour)
    return True


def _refuse_access(answer: httpx.Response, config: RemoteConfig) -> None:
    if answer.status_code in (401, 403):
        raise BackendMisconfigured(
            f"The LLM backend at {config.url} refused the gateway's key ({answer.status_code}): set "
            "--llm-backend-api-key to a key it takes.")


def _served(http: httpx.Client) -> list[str]:
    """The model names GET /models lists; none when it does not say."""
    try:
        answer = http.get("/models")
        return [str(m["id"]) for m in answer.json()["data"]] if answer.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []
