"""Termination signals as exceptions, so that `finally` blocks run.

systemd, docker and `timeout` stop a process with SIGTERM (a closed terminal sends SIGHUP).
Python's default for both is to die at once, leaving temporary files behind. Inside
:func:`termination_as_exception` they raise :class:`TerminatedBySignal` in the main thread
instead, so a streamed WAV's temp file is removed and the process can exit with the
conventional status 128 + signal number.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


class TerminatedBySignal(BaseException):
    """Raised in the main thread on SIGTERM/SIGHUP.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` clauses do not
    swallow a request to stop.
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.name = signal.Signals(self.signum).name
        super().__init__(f"terminated by {self.name}")

    @property
    def exit_code(self) -> int:
        """The shell's status for a process killed by this signal (143 for SIGTERM)."""
        return 128 + self.signum


@contextmanager
def termination_as_exception(
    signals: tuple[signal.Signals, ...] = DEFAULT_SIGNALS,
) -> Iterator[None]:
    """Within the block, the given signals raise TerminatedBySignal (once; repeats while the
    cleanup runs are ignored). Previous handlers are restored on exit. Outside the main
    thread, where Python cannot install handlers, this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if raised:
            return  # already unwinding: let the cleanup finish
        raised = True
        raise TerminatedBySignal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
