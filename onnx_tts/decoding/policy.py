"""Scheduling policy: every decision about who gets the cores, computed as plain data.

The decode scheduler, the vocoder stage and stream admission each describe what waits (plain
`Urgency` records: priority, when the work is due, arrival order) and ask the policy; the
policy returns a plan (`DecodePlan`: requests to admit into which rows, prefills that start or
get a chunk turn, rows that step, rows that sit a step out; an order of vocoder windows;
whether a stream may start), and the caller applies it. Deciding and running stay apart, as
vLLM v1's `schedule()` and `update_from_output()` are, so a policy is one replaceable part,
tested without a model:

- `DeadlinePolicy` (the default): most urgent first (priority, then the earliest due time: a
  listener about to run dry, a first-audio deadline, a batch request's arrival plus slack);
  while a row is urgent, rows whose listeners hold plenty of audio sit a step out (unless
  requests wait for a row); a stream starts only while there is capacity and no playing
  listener is about to run dry.
- `FifoPolicy`: first come first served everywhere; every row steps; a stream starts while
  there is capacity.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from onnx_tts.errors import InputError

# Deadline pacing: a row is urgent when its listener runs dry (or its first audio is due)
# within URGENT_SECONDS; rows with more than AHEAD_SECONDS of audio buffered then wait.
URGENT_SECONDS = 0.5
AHEAD_SECONDS = 1.0
# A new stream waits while a playing listener has less than this much audio left. Every stream
# that just started trips it (one first chunk of ~0.12 s ahead), which costs new streams a
# moment (measured: ~25 ms on the p95 time to first audio at 8 clients on a loaded machine,
# none on a quiet one); at 0.05 s, 32 clients stalled when the machine slowed down under
# other work, at 0.3 s they did not (`bench serve`).
MIN_LEAD_SECONDS = 0.3


@dataclass(frozen=True)
class Urgency:
    """What a policy knows of one request, stream or window: its priority (lower first),
    when it next needs compute (monotonic seconds) and its arrival order."""

    priority: int
    due: float
    order: int


@dataclass(frozen=True)
class DecodeView:
    """The decode scheduler at one round: waiting requests, free rows, the rows decoding
    (row, urgency), the time, and the rows whose prompt is being prefilled apart from the
    step (row, urgency, whether it waits for a chunk turn)."""

    waiting: tuple[Urgency, ...]
    free_rows: tuple[int, ...]
    active: tuple[tuple[int, Urgency], ...]
    now: float
    prefilling: tuple[tuple[int, Urgency, bool], ...] = ()


@dataclass(frozen=True)
class DecodePlan:
    """One round: `admit` (index into the view's waiting, row) in admission order; `prefill`,
    the rows whose prefill works this round: the admitted ones start (in admission order),
    then the prefills granted a chunk turn; `step`, the decoding rows that run this step;
    `sit_out`, decoding rows that wait. A row being prefilled never steps."""

    admit: tuple[tuple[int, int], ...] = ()
    step: tuple[int, ...] = ()
    sit_out: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()


@dataclass(frozen=True)
class StreamLoad:
    """What stream admission measured: active streams, the streams the machine sustains in
    real time, seconds until the first playing listener runs dry (None: none plays), and
    whether any stream gets real time here."""

    active: int
    capacity: int
    lead: float | None
    real_time: bool


class SchedulingPolicy(ABC):
    """Decides; never runs anything (module docstring)."""

    name: str
    # Chunked prefill: prefills that run one chunk per round (the most urgent first).
    prefill_turns: int = 1

    @abstractmethod
    def order(self, items: Sequence[Urgency]) -> list[int]:
        """Indices of `items`, the one to serve first first."""

    @abstractmethod
    def pace(self, active: Sequence[tuple[int, Urgency]], now: float) -> tuple[list, list]:
        """(rows that step, rows that sit out) of the rows decoding."""

    @abstractmethod
    def stream_may_start(self, load: StreamLoad) -> bool:
        """Whether one more stream may start now."""

    def schedule(self, view: DecodeView) -> DecodePlan:
        """Admit the first waiting requests (in `order`) into the free rows, lowest row
        first, and start their prefills; give `prefill_turns` chunk turns to the prefills
        waiting for one (in `order`); pace the decoding rows. A prompt being prefilled does
        not make decoding rows sit out: it runs apart from the step (sitting out would only
        idle the decode worker) or a chunk per round (sitting out would make the round the
        chunk alone: the whole prompt before the next step, as if it ran inline)."""
        # (no free row: nothing to order; the queue may be long and this runs every round)
        chosen = self.order(view.waiting)[: len(view.free_rows)] if view.free_rows else []
        admit = tuple(zip(chosen, view.free_rows, strict=False))
        wanting = [(row, urgency) for row, urgency, wants in view.prefilling if wants]
        turns = [wanting[i][0] for i in self.order([u for _, u in wanting])[: self.prefill_turns]]
        # While requests wait for a row, every row steps: a row that sat out would only hold
        # its row longer (with short streams arriving all the time some row is always urgent,
        # and rows ahead sat out for good while new streams waited for them: `bench serve`,
        # 16 clients on 8 rows).
        if len(view.waiting) > len(admit):
            step, sit_out = [row for row, _ in view.active], []
        else:
            step, sit_out = self.pace(view.active, view.now)
        return DecodePlan(
            admit, tuple(sorted(step)), tuple(sorted(sit_out)), (*(row for _, row in admit), *turns)
        )


class DeadlinePolicy(SchedulingPolicy):
    """Most urgent first; work-conserving deadline pacing (module docstring)."""

    name = "deadline"

    def __init__(
        self,
        urgent_seconds: float = URGENT_SECONDS,
        ahead_seconds: float = AHEAD_SECONDS,
        min_lead_seconds: float = MIN_LEAD_SECONDS,
    ) -> None:
        self.urgent, self.ahead, self.min_lead = urgent_seconds, ahead_seconds, min_lead_seconds

    def order(self, items: Sequence[Urgency]) -> list[int]:
        return sorted(range(len(items)), key=lambda i: _key(items[i]))

    def pace(self, active: Sequence[tuple[int, Urgency]], now: float) -> tuple[list, list]:
        """While some row is urgent (due within `urgent_seconds`), rows with more than
        `ahead_seconds` of slack sit the step out, so the cores go to the streams that would
        stall; otherwise every row steps."""
        rows = [row for row, _ in active]
        if len(active) < 2 or min(u.due - now for _, u in active) >= self.urgent:
            return rows, []
        step = [row for row, u in active if u.due - now <= self.ahead]
        return step, [row for row in rows if row not in step]

    def stream_may_start(self, load: StreamLoad) -> bool:
        if load.active >= load.capacity:
            return False
        # A listener about to run dry is served first.
        return not (
            load.real_time and load.active and load.lead is not None and load.lead < self.min_lead
        )


class FifoPolicy(SchedulingPolicy):
    """First come first served; every row steps every round."""

    name = "fifo"

    def order(self, items: Sequence[Urgency]) -> list[int]:
        return sorted(range(len(items)), key=lambda i: items[i].order)

    def pace(self, active: Sequence[tuple[int, Urgency]], now: float) -> tuple[list, list]:
        return [row for row, _ in active], []

    def stream_may_start(self, load: StreamLoad) -> bool:
        return load.active < load.capacity


def _key(urgency: Urgency) -> tuple[int, float, int]:
    return (urgency.priority, urgency.due, urgency.order)


POLICIES: dict[str, type[SchedulingPolicy]] = {
    policy.name: policy for policy in (DeadlinePolicy, FifoPolicy)
}


def make_policy(name: str | SchedulingPolicy | None) -> SchedulingPolicy:
    """The policy called `name` (default: deadline), or the given policy object."""
    if isinstance(name, SchedulingPolicy):
        return name
    if name is None:
        return DeadlinePolicy()
    if name not in POLICIES:
        raise InputError(f"unknown scheduling policy {name!r}; choose {', '.join(POLICIES)}")
    return POLICIES[name]()


__all__ = [
    "AHEAD_SECONDS",
    "POLICIES",
    "URGENT_SECONDS",
    "DeadlinePolicy",
    "DecodePlan",
    "DecodeView",
    "FifoPolicy",
    "SchedulingPolicy",
    "StreamLoad",
    "Urgency",
    "make_policy",
]
