"""The categories of round four (issue 36), one module each; importing this adds their cases to
attack_live.LIVE_CASES and their probes and configurations to its registries."""

from __future__ import annotations

from benchmarks import attack_names, attack_stores, attack_wyoming_conn

ROUND_FOUR = (attack_names, attack_stores, attack_wyoming_conn)
