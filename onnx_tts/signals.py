"""Termination signals as exceptions, so that `finally` blocks run.

systemd, docker and `timeout` stop a process with SIGTERM, a closed terminal sends SIGHUP,
Ctrl-C SIGINT, Ctrl-\\ SIGQUIT, and scripts send SIGUSR1, SIGALRM and the like: the default
action of each ends the process at once, leaving temporary files behind. Inside
:func:`termination_as_exception` every signal whose default action ends the process raises
:class:`TerminatedBySignal` in the main thread instead, so a streamed WAV's temp file is removed
and the process can exit with the conventional status 128 + signal number. Left alone: SIGKILL
and SIGSTOP (they cannot be caught), the faults a handler cannot return from (SIGSEGV, SIGBUS,
SIGFPE, SIGILL), SIGPIPE and SIGXFSZ (Python ignores them: the write fails with EPIPE or EFBIG
instead, which the writers report), and any signal the process was started with ignored
(`nohup` ignores SIGHUP on purpose).

:func:`deferred` holds these signals back for the few statements that create a temporary file
and register it for removal, so that no signal can fall between the two.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

_ENDING = (
    "SIGHUP SIGINT SIGQUIT SIGTRAP SIGABRT SIGUSR1 SIGUSR2 SIGALRM SIGTERM SIGSTKFLT SIGXCPU "
    "SIGVTALRM SIGPROF SIGIO SIGPWR SIGSYS"
).split()


def terminating_signals() -> tuple[signal.Signals, ...]:
    """Every catchable signal whose default action ends the process (see the module
    docstring for those left alone), real-time signals included."""
    found = {getattr(signal, name) for name in _ENDING if hasattr(signal, name)}
    if hasattr(signal, "SIGRTMIN"):
        found.update(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    valid = signal.valid_signals()
    return tuple(sorted((s for s in found if s in valid), key=int))  # type: ignore[misc]


DEFAULT_SIGNALS: tuple[signal.Signals, ...] = terminating_signals()


def handled_signals() -> tuple[signal.Signals, ...]:
    """The terminating signals a process should handle now: all of them but those it was
    started with ignored (`nohup` ignores SIGHUP on purpose: it stays ignored). For a server
    that stops on each of them as it does on SIGTERM."""
    return tuple(sig for sig in DEFAULT_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN)


class TerminatedBySignal(BaseException):
    """Raised in the main thread on a terminating signal.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` clauses do not
    swallow a request to stop.
    """

    def __init__(self, signum: int, completed: bool = False) -> None:
        self.signum = int(signum)
        self.completed = completed  # it came once the outputs were in place (`committing`)
        try:
            self.name = signal.Signals(self.signum).name
        except ValueError:  # a real-time signal has no name of its own
            self.name = f"SIGRTMIN+{self.signum - int(signal.SIGRTMIN)}"
        super().__init__(f"terminated by {self.name}")

    @property
    def exit_code(self) -> int:
        """The shell's status for a process killed by this signal (143 for SIGTERM)."""
        return 128 + self.signum


class _Termination:
    """The handler of termination_as_exception: raises once, and not inside `deferred`."""

    def __init__(self) -> None:
        self.raised = False
        self.deferring = 0
        self.pending: int | None = None
        self.completed = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.raised:
            return  # already unwinding: let the cleanup finish
        if self.deferring:
            self.pending = signum  # raised when the deferred block ends
            return
        self.end(signum)

    def end(self, signum: int) -> NoReturn:
        """Raise TerminatedBySignal for `signum`; any later signal is ignored."""
        self.raised = True
        raise TerminatedBySignal(signum, self.completed)


_active: _Termination | None = None  # the handler in force, if any


@contextmanager
def termination_as_exception(
    signals: tuple[signal.Signals, ...] = DEFAULT_SIGNALS,
) -> Iterator[None]:
    """Within the block, the given signals raise TerminatedBySignal (once; repeats while the
    cleanup runs are ignored), but those the process was started with ignored. Previous
    handlers are restored on exit. Outside the main thread, where Python cannot install
    handlers, this does nothing."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Termination()
    previous = {}
    for sig in signals:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        try:
            previous[sig] = signal.signal(sig, handler)
        except (OSError, ValueError, RuntimeError):  # reserved by the C library
            continue
    outer, _active = _active, handler
    try:
        yield
    finally:
        _active = outer
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def deferred() -> Iterator[None]:
    """A termination signal that arrives inside the block (Python runs handlers in the main
    thread, whichever thread the signal reached) raises when the block ends: for creating a
    temporary file and registering it for removal as one step. Outside the main thread, or
    without termination_as_exception in force, nothing."""
    handler = _active
    if handler is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    handler.deferring += 1
    try:
        yield
    finally:
        handler.deferring -= 1
        if not handler.deferring and handler.pending is not None and not handler.raised:
            signum, handler.pending = handler.pending, None
            handler.end(signum)


@contextmanager
def committing() -> Iterator[None]:
    """The last step of a command: its finished outputs are renamed into place, as one step
    no termination signal falls inside. If the block completes, the command has done its work:
    a signal held meanwhile, or one that comes later, still ends the process, but as
    TerminatedBySignal(completed=True), which the CLI reports with exit status 0 (a failed
    exit status promises the outputs were left as they were)."""
    handler = _active
    with deferred():
        yield
        if handler is not None:
            handler.completed = True


def keep_status_on_late_signals(status: int) -> None:
    """For what is left of the process once its command returned `status` (the interpreter
    ending, ONNX Runtime's teardown): a terminating signal ends it at once with that status,
    and a line when it was 0 (the outputs are whole), instead of the default action, whose
    128 + N would say the run failed. Signals the process was started with ignored stay so.
    For the process's own entry point only (the handlers stay installed)."""
    import atexit
    import os
    import sys

    def end(signum: int, frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        if status == 0:
            name = TerminatedBySignal(signum).name
            os.write(2, f"onnx-tts: {name} after the work was done\n".encode())
        os._exit(status)

    if threading.current_thread() is not threading.main_thread():
        return
    installed = []
    for sig in DEFAULT_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        try:
            signal.signal(sig, end)
        except (OSError, ValueError, RuntimeError):
            continue
        installed.append(sig)

    def ignore_while_ending() -> None:
        for sig in installed:
            signal.signal(sig, signal.SIG_IGN)

    # The interpreter's finalization puts the default action back for a signal with a Python
    # handler before it tears the modules down (ONNX Runtime's sessions among them), and any
    # thread may take a signal sent to the process: from the exit handlers on, the signals are
    # ignored instead (finalization keeps that), so the process ends with its own status.
    atexit.register(ignore_while_ending)
