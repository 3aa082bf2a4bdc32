"""One real gateway (embedded models) for the integration tests, and a second one with API keys."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway_process import GatewayProcess, start_gateway

MODEL = "smollm2-135m-instruct"
API_KEY = "sk-test-key"
RESUME_WINDOW_S = 3


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A short resume window, so that the tests see what happens to streams nobody comes back for."""
    process = start_gateway("--resume-window-s", str(RESUME_WINDOW_S), log_path=tmp_path_factory.mktemp("gateway") / "gateway.log")
    yield process
    process.stop()


@pytest.fixture(scope="session")
def secured_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Text only, with an API key, a small rate limit, a 1024-token context, one request at a time; its log
    is text and holds the users' content (test_logs.py)."""
    process = start_gateway(
        "--log-format",
        "text",
        "--log-content",
        "--api-keys",
        API_KEY,
        "--no-load-voice-models",
        "--rate-limit-rpm",
        "30",
        "--max-context-tokens",
        "1024",
        "--max-batch-size",
        "1",
        "--max-queued-requests",
        "1",
        log_path=tmp_path_factory.mktemp("secured") / "gateway.log",
    )
    yield process
    process.stop()

