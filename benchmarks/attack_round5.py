"""The categories of round five (issue 43), one module each; importing this adds their cases
to attack_live.LIVE_CASES (in this fixed order, so case ids do not depend on import order) and
their probes to its registries."""

from __future__ import annotations

from benchmarks import attack_leftovers, attack_markup, attack_requests, attack_tools

ROUND_FIVE = (attack_markup, attack_requests, attack_tools, attack_leftovers)
for _module in ROUND_FIVE:
    _module.register_cases()
