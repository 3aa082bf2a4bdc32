"""The classifier hook: entry points and their results, and a watch that runs beside a reply and stops it."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.safety.hooks import ClassifierWatch, EntryPointClassifier, Verdict, load_classifier


def flags_dragons(text: str) -> dict[str, object]:
    time.sleep(0.2)  # a slow model: it runs in a worker thread
    return {"flagged": "dragon" in text, "categories": {"violence": "dragon" in text, "hate": False}}


async def async_flags_everything(text: str) -> bool:
    return True


def broken(text: str) -> str:
    return "yes"


async def test_entry_points() -> None:
    sync = EntryPointClassifier(f"{__name__}:flags_dragons")
    assert await sync.classify("a dragon") == Verdict(True, ("violence",))
    assert await sync.classify("a cat") == Verdict(False, ())
    assert await EntryPointClassifier(f"{__name__}:async_flags_everything").classify("x") == Verdict(True)
    with pytest.raises(ValueError, match="neither an http"):
        load_classifier("no_colon_here", None, 1.0)
    with pytest.raises(ValueError, match="cannot load"):
        load_classifier(f"{__name__}:missing", None, 1.0)


async def test_the_watch_runs_beside_and_stops_at_once() -> None:
    stopped: list[float] = []
    watch = ClassifierWatch(EntryPointClassifier(f"{__name__}:flags_dragons"), stop=lambda: stopped.append(time.monotonic()),
                            timeout_s=2.0)
    started = time.monotonic()
    watch.check("tell me about a dragon")
    assert time.monotonic() - started < 0.05  # never waits for the verdict
    await asyncio.sleep(0.5)
    assert watch.flagged == Verdict(True, ("violence",)) and len(stopped) == 1
    await watch.close()


async def test_a_failing_or_late_classifier_lets_the_reply_through() -> None:
    failing = ClassifierWatch(EntryPointClassifier(f"{__name__}:broken"), stop=lambda: None, timeout_s=1.0)
    await failing.finish("anything")
    assert failing.flagged is None
    await failing.close()
    late = ClassifierWatch(EntryPointClassifier(f"{__name__}:flags_dragons"), stop=lambda: None, timeout_s=0.05)
    started = time.monotonic()
    await late.finish("a dragon")
    assert time.monotonic() - started < 0.15 and late.flagged is None
    await late.close()  # the late verdict is cancelled, not left running
