"""A list endpoint's page as its query asks for it (each endpoint declares its own defaults and docs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class PageQuery:
    after: str | None  # the id after which the page starts (the previous page's last_id)
    limit: int
    order: Literal["asc", "desc"]
