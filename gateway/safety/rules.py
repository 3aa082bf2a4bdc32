"""The policy the settings describe (--safety, --safety-pii, --safety-denylist, --safety-denylist-action)."""

from __future__ import annotations

from gateway.platform.config import Settings
from gateway.safety.detectors import load_denylist, pii_detectors
from gateway.safety.policy import Rule, SafetyPolicy


def build_policy(settings: Settings) -> SafetyPolicy:
    """An empty policy (falsy) with --no-safety; DenylistError for a denylist file it cannot use."""
    if not settings.safety:
        return SafetyPolicy([])
    rules: list[Rule] = []
    if settings.safety_denylist is not None:
        denylist = load_denylist(settings.safety_denylist)
        if denylist is not None:
            rules.append(Rule(denylist, settings.safety_denylist_action))
    if settings.safety_pii != "off":
        rules += [Rule(detector, settings.safety_pii) for detector in pii_detectors(settings.safety_phone_region)]
    return SafetyPolicy(rules)
