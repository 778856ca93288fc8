"""The categories of round four (issue 36), one module each; importing this adds their cases to
attack_live.LIVE_CASES (in this fixed order, so case ids do not depend on import order) and
their probes and configurations to its registries."""

from __future__ import annotations

from benchmarks import (
    attack_files,
    attack_names,
    attack_process,
    attack_stores,
    attack_wyoming_conn,
)

ROUND_FOUR = (attack_names, attack_stores, attack_wyoming_conn, attack_files, attack_process)
for _module in ROUND_FOUR:
    _module.register_cases()
