"""SIGTERM/SIGHUP become an exception, so cleanup runs and no temp file is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from onnx_tts.signals import TerminatedBySignal, termination_as_exception
from tests.waiting import WAIT_BOUND_SECONDS


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_raises_inside_the_block_and_handlers_are_restored(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(TerminatedBySignal) as caught, termination_as_exception():
        os.kill(os.getpid(), sig)
        signal.sigtimedwait([], 0)  # give the interpreter a bytecode boundary
    assert caught.value.signum == sig and caught.value.exit_code == 128 + sig
    assert signal.getsignal(sig) == before
    assert not issubclass(TerminatedBySignal, Exception)


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
