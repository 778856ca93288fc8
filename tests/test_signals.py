"""SIGTERM/SIGHUP become an exception, so cleanup runs and no temp file is left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile

from onnx_tts.signals import TerminatedBySignal, termination_as_exception
from tests.waiting import WAIT_BOUND_SECONDS


@contextlib.contextmanager
def _inherited(sig: signal.Signals, disposition: signal.Handlers) -> Iterator[None]:
    """The process as if started with `disposition` for `sig` (under nohup SIGHUP comes in
    ignored: the suite may run so), whatever the runner's was; restored after."""
    original = signal.signal(sig, disposition)
    try:
        yield
    finally:
        signal.signal(sig, original)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_raises_inside_the_block_and_handlers_are_restored(sig: signal.Signals) -> None:
    with _inherited(sig, signal.SIG_DFL):
        with pytest.raises(TerminatedBySignal) as caught, termination_as_exception():
            os.kill(os.getpid(), sig)
            signal.sigtimedwait([], 0)  # give the interpreter a bytecode boundary
        assert caught.value.signum == sig and caught.value.exit_code == 128 + sig
        assert signal.getsignal(sig) is signal.SIG_DFL
    assert not issubclass(TerminatedBySignal, Exception)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_inherited_ignored_stays_ignored_inside_the_block(sig: signal.Signals) -> None:
    """Started under nohup (SIGHUP ignored on purpose), the block keeps the signal ignored:
    it raises nothing and the disposition is still SIG_IGN after."""
    with _inherited(sig, signal.SIG_IGN):
        with termination_as_exception():
            assert signal.getsignal(sig) is signal.SIG_IGN
            os.kill(os.getpid(), sig)
            signal.sigtimedwait([], 0)
        assert signal.getsignal(sig) is signal.SIG_IGN


def test_sigterm_removes_a_streamed_wav_temp_file(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        import numpy as np
        from onnx_tts.audio import ProgressiveWavWriter
        from onnx_tts.signals import TerminatedBySignal, termination_as_exception
        target = {str(tmp_path / "o.wav")!r}
        try:
            with termination_as_exception(), ProgressiveWavWriter(target, 24000) as w:
                w.write(np.zeros(100, np.float32))
                print("ready", flush=True)
                while True:
                    time.sleep(0.01)
        except TerminatedBySignal as stop:
            sys.exit(stop.exit_code)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_BOUND_SECONDS) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


# -- issue 36: every signal that ends the CLI, through the real CLI -------------------------------

LONG_TEXT = " ".join(
    f"Sentence number {i} keeps the generator busy for a while." for i in range(400)
)
# What `man 7 signal` says ends a process by default and a handler can survive; the rest is
# left alone on purpose (see onnx_tts.signals).
ENDING = [
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTRAP", "SIGABRT", "SIGUSR1", "SIGUSR2", "SIGALRM",
    "SIGTERM", "SIGSTKFLT", "SIGXCPU", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSYS",
]  # fmt: skip


def test_every_catchable_terminating_signal_is_handled() -> None:
    from onnx_tts.signals import terminating_signals

    handled = set(terminating_signals())
    expected = {getattr(signal, name) for name in ENDING if hasattr(signal, name)}
    expected |= set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    assert handled == expected
    never = {signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
             signal.SIGILL, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD}  # fmt: skip
    assert not handled & never


def _as_a_shell_starts_it(ignored: tuple[int, ...] = ()):
    def start() -> None:
        # A test runner started in the background inherits SIGINT and SIGQUIT ignored (under
        # nohup SIGHUP too); an interactive shell starts commands with them at their defaults.
        from onnx_tts.signals import terminating_signals

        for sig in terminating_signals():
            signal.signal(sig, signal.SIG_DFL)
        for sig in ignored:  # e.g. nohup
            signal.signal(sig, signal.SIG_IGN)

    return start


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _synth(target: Path, stream: bool, ignored: tuple[int, ...] = ()) -> subprocess.Popen:
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", LONG_TEXT, "-o", str(target), "-q"]
    return subprocess.Popen(
        [*command, *(["--stream"] if stream else [])],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_shell_starts_it(ignored),
    )


def _wait_until_working(proc: subprocess.Popen, directory: Path, stream: bool) -> None:
    """Streaming: until the temp file exists; one-shot: until the model has loaded and the
    synthesis runs (a CPU-time condition, not a clock)."""
    while proc.poll() is None:
        if stream and any(p.name.endswith(".part") for p in directory.iterdir()):
            return
        if not stream and _cpu_seconds(proc.pid) > 1.5:
            return
        signal.sigtimedwait([], 0.02)
    raise AssertionError(f"the CLI ended before the signal: {proc.stderr.read()}")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "one-shot"])
@pytest.mark.parametrize(
    "name",
    ["SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT", "SIGPROF",
     "SIGVTALRM", "SIGXCPU", "SIGRTMIN+1"],
)  # fmt: skip
def test_a_terminating_signal_leaves_no_part_file_and_keeps_the_target(
    tmp_path: Path, name: str, stream: bool
) -> None:
    sig = signal.SIGRTMIN + 1 if name == "SIGRTMIN+1" else getattr(signal, name)
    target = tmp_path / "out.wav"
    target.write_bytes(b"RIFF the user's old file")
    proc = _synth(target, stream)
    _wait_until_working(proc, tmp_path, stream)
    proc.send_signal(sig)
    assert proc.wait(timeout=300) == 128 + sig
    lines = proc.stderr.read().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnx-tts: terminated by SIG"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]
    assert target.read_bytes() == b"RIFF the user's old file"


def test_a_signal_the_cli_was_started_with_ignored_stays_ignored(tmp_path: Path) -> None:
    """nohup starts a command with SIGHUP ignored so that it outlives its terminal."""
    target = tmp_path / "out.wav"
    proc = _synth(target, stream=True, ignored=(signal.SIGHUP,))
    _wait_until_working(proc, tmp_path, stream=True)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]
    assert soundfile.info(str(target)).duration > 10


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGALRM, signal.SIGQUIT])
def test_a_signal_while_a_temp_file_is_open_removes_it(tmp_path: Path, sig: int) -> None:
    """The temp files of an atomic write are registered from the moment they exist: the CLI's
    way out removes whatever a signal left (the writer itself did not get to clean up)."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from onnx_tts.atomic_files import remove_temp_files, temp_beside
        from pathlib import Path
        from onnx_tts.signals import TerminatedBySignal, termination_as_exception
        try:
            with termination_as_exception():
                try:
                    fd, name = temp_beside(Path({str(tmp_path / "o.wav")!r}))
                    os.write(fd, b"half a file")
                    os.kill(os.getpid(), {int(sig)})
                    signal.sigtimedwait([], 5)
                except BaseException:
                    remove_temp_files()
                    raise
        except TerminatedBySignal as stop:
            sys.exit(stop.exit_code)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], preexec_fn=_as_a_shell_starts_it(), timeout=120
    )
    assert done.returncode == 128 + sig
    assert list(tmp_path.iterdir()) == []


def test_a_signal_inside_deferred_is_raised_when_the_block_ends() -> None:
    """Python runs signal handlers in the main thread whichever thread the signal reached, so
    blocking it in one thread does not hold it back: the handler itself defers."""
    import threading

    from onnx_tts.signals import deferred

    reached = []
    done = threading.Event()
    other = threading.Thread(target=done.wait)  # a thread the kernel may deliver the signal to
    other.start()
    try:
        with pytest.raises(TerminatedBySignal) as caught, termination_as_exception():
            with deferred():
                os.kill(os.getpid(), signal.SIGUSR1)
                signal.sigtimedwait([], 0.01)  # bytecode boundaries: the handler has run
                sum(range(1000))
                reached.append("end of the block")
            reached.append("after the block")
    finally:
        done.set()
        other.join()
    assert reached == ["end of the block"] and caught.value.signum == signal.SIGUSR1


def test_a_signal_during_the_commit_ends_the_run_as_completed() -> None:
    """A signal that comes while the outputs are renamed into place is held until they all
    are, then ends the run as completed (the CLI exits 0: its outputs are whole)."""
    from onnx_tts.signals import committing

    committed = []
    with pytest.raises(TerminatedBySignal) as caught, termination_as_exception(), committing():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.01)  # the handler has run (and held it)
        committed += ["audio", "captions"]
    assert committed == ["audio", "captions"] and caught.value.completed


def test_a_signal_after_the_commit_is_completed_and_one_before_is_not() -> None:
    from onnx_tts.signals import committing

    with pytest.raises(TerminatedBySignal) as before, termination_as_exception():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.01)
    assert not before.value.completed
    with pytest.raises(TerminatedBySignal) as after, termination_as_exception():
        with committing():
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.01)
    assert after.value.completed


def test_a_commit_that_fails_is_not_completed() -> None:
    from onnx_tts.signals import committing

    with pytest.raises(TerminatedBySignal) as caught, termination_as_exception(), committing():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.01)
        raise OSError("disk full")
    assert not caught.value.completed


_ENDS_MID_SYNTHESIS = """
import atexit, threading
import onnx_tts

engine = onnx_tts.load()
first_audio = threading.Event()


def listen(text):
    try:
        for _ in engine.stream(text):
            first_audio.set()
    except onnx_tts.OnnxTTSError:  # "the engine was closed": the program is ending
        pass


for index in range(4):  # several streams: the vocoder stage decodes windows side by side
    sentences = f"Sentence {index} keeps the engine busy while the program ends. " * 40
    threading.Thread(target=listen, args=(sentences,), daemon=True).start()
assert first_audio.wait(300)


@atexit.register  # registered last, so it runs first of the atexit hooks
def report():
    print(sorted(t.name for t in threading.enumerate() if t.name.startswith("onnx-tts")))
"""


def test_a_program_that_ends_mid_synthesis_exits_quietly_with_the_workers_closed() -> None:
    """The main thread ends while streams decode on daemon threads: the engine's workers are
    closed as it ends, before concurrent.futures stops taking work (a worker handing its pool
    a window then died with 'Exception in thread' on stderr) and before atexit's hooks run."""
    done = subprocess.run(
        [sys.executable, "-c", _ENDS_MID_SYNTHESIS],
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_SECONDS,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.strip() == "[]", done.stdout
