"""pipecat's OpenAI TTS service (as a library) against an onnx-tts server.

pipecat-ai pins soundfile 0.13 and pulls numba, so it is not a test dependency; run this in a
separate virtualenv that has pipecat-ai and httpx:

    python -m venv --system-site-packages /tmp/pipecat && /tmp/pipecat/bin/pip install pipecat-ai
    onnx-tts serve --port 8880 &
    /tmp/pipecat/bin/python tools/check_pipecat.py --url http://127.0.0.1:8880

It runs OpenAITTSService.run_tts with pipecat's defaults (model gpt-4o-mini-tts, voice alloy,
pcm at 24 kHz) plus instructions, and checks the audio frames: 24 kHz mono s16, as long as the
server's own 24 kHz pcm for the same text (pipecat plays pcm at 24 kHz: a 16 kHz stream would
play 1.5x too fast), streamed in several frames. Exit 0 when it all holds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import httpx

TEXT = "Hello from pipecat. This sentence is spoken by onnx-tts through the OpenAI service."


async def frames(url: str, instructions: str | None) -> list:
    """The audio frames pipecat's pipeline carries for TEXT, as a pipecat app runs it."""
    from pipecat.frames.frames import EndFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.tts import OpenAITTSService

    class Collect(FrameProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.frames: list[TTSAudioRawFrame] = []

        async def process_frame(self, frame: object, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.frames.append(frame)
            await self.push_frame(frame, direction)

    service = OpenAITTSService(
        api_key="unused",
        base_url=url + "/v1",
        settings=OpenAITTSService.Settings(instructions=instructions),
    )
    collect = Collect()
    task = PipelineTask(
        Pipeline([service, collect]), params=PipelineParams(audio_out_sample_rate=24000)
    )
    await task.queue_frames([TTSSpeakFrame(TEXT), EndFrame()])
    await PipelineRunner(handle_sigint=False).run(task)
    return collect.frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pipecat OpenAITTSService -> onnx-tts")
    parser.add_argument("--url", default="http://127.0.0.1:8880")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    reference = httpx.post(
        url + "/v1/audio/speech",
        json={
            "model": "gpt-4o-mini-tts",
            "voice": "alloy",
            "input": TEXT,
            "response_format": "pcm",
        },
        timeout=120,
    )
    reference.raise_for_status()
    if reference.headers["x-sample-rate"] != "24000":
        print(f"FAILED: pcm is {reference.headers['x-sample-rate']} Hz, not 24000", file=sys.stderr)
        return 1
    got = asyncio.run(frames(url, None))
    audio = b"".join(f.audio for f in got)
    print(
        f"pipecat: {len(got)} audio frames, {len(audio) / 48000:.2f} s at "
        f"{got[0].sample_rate if got else '?'} Hz, {got[0].num_channels if got else '?'} channel"
    )
    problems = []
    if not got or any(f.sample_rate != 24000 or f.num_channels != 1 for f in got):
        problems.append("frames are not 24 kHz mono")
    if len(got) < 2:
        problems.append("the audio came as one frame, not streamed")
    if abs(len(audio) - len(reference.content)) > 0.05 * len(reference.content):
        problems.append(
            f"{len(audio)} bytes of audio, the server's pcm has {len(reference.content)}"
        )
    slow = b"".join(f.audio for f in asyncio.run(frames(url, "Speak slowly.")))
    print(f"with instructions 'Speak slowly.': {len(slow) / 48000:.2f} s")
    if not len(slow) > len(audio):
        problems.append("instructions 'Speak slowly.' did not slow the speech")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    if not problems:
        print("OK")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
