"""Classifiers beside the rules (--safety-classifier): a Python entry point (`package.module:function`) or an
HTTP moderation endpoint that speaks OpenAI's /v1/moderations shape (`{"input": text}` in,
`{"results": [{"flagged": bool, "categories": {...}}]}` out).

A classifier never delays the first token: a reply's classifications (the user's message at once, the reply's
text each time CHECK_CHARS more of it went out, all of it at the end) run beside its generation, and a flagged
verdict stops it at once, as a block rule's match does. Before a reply ends, its last classifications get
--safety-classifier-timeout-s; one that fails or is late lets the reply through (fail open, logged and
counted): the rules still hold.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from gateway.platform import metrics
from gateway.platform.latency import TurnMarks

log = logging.getLogger(__name__)
CHECK_CHARS = 200  # a reply's text is classified again each time this much more has gone out


@dataclass(frozen=True)
class Verdict:
    flagged: bool
    categories: tuple[str, ...] = ()


class ClassifierError(RuntimeError):
    """The classifier did not answer usefully (unreachable, an error status, a body of another shape)."""


class Classifier(Protocol):
    async def classify(self, text: str) -> Verdict: ...


def _verdict(result: Any) -> Verdict:
    """A bool, or a moderation result: a mapping with `flagged` and optional `categories` (name -> bool)."""
    if isinstance(result, bool):
        return Verdict(result)
    if isinstance(result, Mapping) and isinstance(result.get("flagged"), bool):
        categories = result.get("categories") or {}
        names = tuple(sorted(name for name, on in categories.items() if on)) if isinstance(categories, Mapping) else ()
        return Verdict(result["flagged"], names)
    raise ClassifierError(f"a classifier result must be a bool or have a bool 'flagged', not {type(result).__name__}")


class EntryPointClassifier:
    """`module:function`, called with the text; it may be async. A plain function runs in a worker thread (a model's
    work never runs on the event loop)."""

    def __init__(self, spec: str) -> None:
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            raise ValueError(f"'{spec}' is neither an http(s) URL nor a Python entry point 'package.module:function'")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load the classifier '{spec}': {exc}") from None
        if not callable(target):
            raise ValueError(f"the classifier '{spec}' is not callable")
        self._function: Callable[[str], Any] = target
        self._async = inspect.iscoroutinefunction(target)

    async def classify(self, text: str) -> Verdict:
        result = await self._function(text) if self._async else await asyncio.to_thread(self._function, text)
        return _verdict(result)


class ModerationEndpoint:
    """A client per call: nothing to close when the gateway stops, for the price of a connection per verdict."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float) -> None:
        self.url = url
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s

    async def classify(self, text: str) -> Verdict:
        try:
            async with httpx.AsyncClient(headers=self._headers, timeout=self._timeout_s) as client:
                response = await client.post(self.url, json={"input": text})
            response.raise_for_status()
            results = response.json()["results"]
            return _verdict(results[0])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ClassifierError(f"moderation endpoint: {type(exc).__name__}: {exc}") from None


def load_classifier(spec: str, api_key: str | None, timeout_s: float) -> EntryPointClassifier | ModerationEndpoint:
    if spec.startswith(("http://", "https://")):
        return ModerationEndpoint(spec, api_key, timeout_s)
    return EntryPointClassifier(spec)


class ClassifierWatch:
    """One reply's classifications: tasks it owns, cancelled and awaited by close()."""

    def __init__(self, classifier: Classifier, *, stop: Callable[[], None], timeout_s: float,
                 marks: TurnMarks | None = None) -> None:
        self.classifier = classifier
        self.stop = stop
        self.timeout_s = timeout_s
        self.marks = marks
        self.flagged: Verdict | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._checked = 0  # characters of the reply classified so far

    @classmethod
    def maybe(cls, classifier: Classifier | None, *, stop: Callable[[], None], timeout_s: float,
              marks: TurnMarks | None = None) -> ClassifierWatch | None:
        return cls(classifier, stop=stop, timeout_s=timeout_s, marks=marks) if classifier is not None else None

    def check(self, text: str) -> None:
        if text.strip() and self.flagged is None:
            self._tasks.add(asyncio.create_task(self._classify(text), name="safety classifier"))

    def output(self, text: str) -> None:
        """The reply's text so far: classified again each time CHECK_CHARS more went out."""
        if len(text) - self._checked >= CHECK_CHARS:
            self._checked = len(text)
            self.check(text)

    async def finish(self, text: str) -> None:
        """The reply is complete: classify what was not, and wait (within the timeout) for every verdict."""
        if len(text) > self._checked:
            self._checked = len(text)
            self.check(text)
        pending = {task for task in self._tasks if not task.done()}
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.timeout_s)
            if late:
                log.warning("the safety classifier took over %.1f s: the reply goes out unclassified", self.timeout_s)
                metrics.SAFETY_CLASSIFIER_FAILURES.labels("timeout").inc()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._tasks.clear()

    async def _classify(self, text: str) -> None:
        try:
            verdict = await self.classifier.classify(text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # fail open: the rules still hold
            log.warning("the safety classifier failed: %s", exc)
            metrics.SAFETY_CLASSIFIER_FAILURES.labels("error").inc()
            return
        if self.marks is not None:
            self.marks.mark("classifier_done", latest=True)
        if verdict.flagged and self.flagged is None:
            self.flagged = verdict
            metrics.SAFETY_FINDINGS.labels("classifier", "classifier", "block").inc()
            self.stop()
