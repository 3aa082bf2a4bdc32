"""A gateway's Prometheus metrics as the tests read them."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_process import GatewayProcess


async def by_outcome(gateway: GatewayProcess, family: str, sample: str) -> dict[str, float]:
    """One sample (`_total`, `_count`) of a family labelled by outcome: resumed and interrupted (0 until seen)."""
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        text = (await http.get("/metrics")).text
    counts = {"resumed": 0.0, "interrupted": 0.0}
    for found in text_string_to_metric_families(text):
        if found.name == family:
            for point in found.samples:
                if point.name == f"{family}{sample}":
                    counts[point.labels["outcome"]] = point.value
    return counts
