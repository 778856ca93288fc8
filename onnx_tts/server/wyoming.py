"""`onnx-tts wyoming`: the Wyoming protocol (Home Assistant's voice services) over onnx-tts.

Home Assistant's Wyoming integration connects to `tcp://HOST:10200`, sends `describe` and
reads `info` (a TTS program and its voices), then `synthesize` (one text) or a streamed text:
`synthesize-start`, `synthesize-chunk`..., `synthesize-stop`. Audio goes back as
`audio-start`, `audio-chunk` (16-bit mono PCM at the model's rate) as it is generated, and
`audio-stop`; a streamed text is spoken sentence by sentence as the sentences complete, and
ends with `synthesize-stopped` (the order Home Assistant expects).

Markup: a text that starts with <speak> is SSML (`text_format` "ssml" forces it, "text" reads
it as plain text), else plain text with inline ``[[ phonemes ]]``; a streamed SSML text is
kept until `synthesize-stop` and spoken whole (text_stream.py). Invalid markup is an `error`
event naming its line and column. `speed` and `sentence_silence` in `synthesize` /
`synthesize-start` are onnx-tts extensions; `voice.language` must be one the model speaks.

Voices: `default`, the model's builtin voices and the voices uploaded to the HTTP server (the
same --voices-dir, or the same Redis), by id with their names as descriptions; a requested name
reaches exactly one voice by the HTTP server's rules (`voice_names`), and a stored voice whose
audio is missing or damaged is an error event at once. Generation runs through the HTTP
server's worker pool and engine calls (one code path for both front ends).

Connections: a client that half-closes its side after sending (`nc -N`) still gets everything
it asked for; one that sends nothing is closed after --idle-timeout (while nothing is being
spoken to it), and one that sends part of an event after --header-timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
import uuid
from typing import Any

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Describe, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.server import AsyncEventHandler, AsyncServer, AsyncTcpServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from onnx_tts.audio import to_pcm16
from onnx_tts.config import WyomingConfig
from onnx_tts.errors import InputError, OnnxTTSError
from onnx_tts.server.engines import ModelRegistry, SpeechModel
from onnx_tts.server.errors import one_line
from onnx_tts.server.jobs import AUDIO, END, ERROR, Busy, Generation
from onnx_tts.server.metrics import SynthesisRecord
from onnx_tts.server.schemas import MAX_INPUT_CHARS
from onnx_tts.server.text_stream import Piece, StreamedText
from onnx_tts.server.threads import blocking, trim_idle_threads
from onnx_tts.server.voice_names import VoiceNameError
from onnx_tts.server.voices import VoiceStoreError, voice_to_speak
from onnx_tts.server.wyoming_events import (
    BadEvent,
    IdleTimeout,
    first_byte,
    malformed,
    read_event,
)
from onnx_tts.server.wyoming_requests import ATTRIBUTION, Speech, error_code, event_options
from onnx_tts.signals import handled_signals

log = logging.getLogger("onnx_tts.server.wyoming")

# The text of one streamed synthesis is bounded.
MAX_STREAM_CHARS = 64 * MAX_INPUT_CHARS
# A text waits at most this long to start before the client is told the server is busy.
QUEUE_TIMEOUT_SECONDS = 10.0


class VoiceRefused(Exception):
    """A requested voice that cannot be spoken: `code` and a one-line message for the client."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class WyomingService:
    """What every connection shares: the model (with its admission control) and the voices."""

    def __init__(
        self, registry: ModelRegistry, voices: Any, config: WyomingConfig | None = None
    ) -> None:
        self.registry = registry
        self.voices = voices
        self.config = config or WyomingConfig()

    def stop(self) -> None:
        for model in list(self.registry.models.values()):
            for job in list(model.jobs.values()):
                job.cancel()

    @property
    def model(self) -> SpeechModel:
        assert self.registry.default is not None
        return self.registry.default

    def info(self) -> Info:
        model = self.model
        listed = [("default", f"{model.name} default voice")]
        listed += [(name, f"{model.name} builtin voice {name}") for name in model.builtin_voices]
        try:
            listed += [(voice.id, voice.name) for voice in self.voices.list()]
        except VoiceStoreError as error:  # a shared store that is down: the others still serve
            log.warning("wyoming: stored voices not listed: %s", error)
        languages = model.languages
        voices = [
            TtsVoice(
                name=name,
                description=description,
                attribution=ATTRIBUTION,
                installed=True,
                version=None,
                languages=list(languages),
            )
            for name, description in listed
        ]
        voices += self._folder_voices()
        return Info(
            tts=[
                TtsProgram(
                    name="onnx-tts",
                    description=f"onnx-tts: {model.name}",
                    attribution=ATTRIBUTION,
                    installed=True,
                    version=_version(),
                    voices=voices,
                    supports_synthesize_streaming=True,
                )
            ]
        )

    def _folder_voices(self) -> list[TtsVoice]:
        """Each model of a folder (a family's folder flag) as a voice of its own: its name,
        its languages and its speakers, as the reference Wyoming TTS server lists its data
        directory."""
        return [
            TtsVoice(
                name=name,
                description=entry.description or name,
                attribution=ATTRIBUTION,
                installed=True,
                version=None,
                languages=list(entry.languages),
                speakers=[TtsVoiceSpeaker(name=s) for s in entry.speakers] or None,
            )
            for name, entry in self.registry.folder_models.items()
        ]

    def _chosen(self, speech: Speech) -> tuple[SpeechModel, str | None]:
        """The model a request names (a folder's model by its name, loaded now if need be;
        else the default) and the voice to ask it for (the speaker of a model by name)."""
        name = speech.voice
        if name and name != self.model.name and name in self.registry.folder_models:
            model = self.registry.get(name)
            assert model is not None
        elif name and name == self.model.name:
            model = self.model
        else:
            return self.model, speech.speaker if speech.speaker and not name else name
        if speech.speaker and speech.speaker not in model.builtin_voices:
            speakers = ", ".join(model.builtin_voices[:10]) or "none: it has one speaker"
            raise VoiceRefused(
                f"voice {name!r} has no speaker {speech.speaker!r}; its speakers: {speakers}",
                "voice_not_found",
            )
        return model, speech.speaker

    def plan(self, speech: Speech) -> Generation:
        """A generation of `speech` (voice None: the model's default voice); reads the voice
        store, so it runs in a worker thread. VoiceRefused with a one-line reason for a voice
        that reaches nothing, several voices, or a stored voice that is refused, and for a
        language the model does not speak."""
        try:
            model, voice = self._chosen(speech)
        except OnnxTTSError as error:  # a folder's model that fails to load
            raise VoiceRefused(one_line(error), "voice_refused") from None
        options = self._language_options(model, speech.language)
        voice_audio = None
        if voice:
            try:
                voice_audio = voice_to_speak(self.voices, self.registry, model, voice)
            except (VoiceNameError, VoiceStoreError) as error:
                raise VoiceRefused(str(error), error.code) from None
            except OnnxTTSError as error:
                raise VoiceRefused(one_line(error), "voice_refused") from None
        return Generation(
            model=model,
            text=speech.text,
            voice_audio=voice_audio,
            seed=None,
            options=options,
            speed=speech.speed,
            output_rate=model.sample_rate,
            ssml=speech.ssml,
            sentence_silence=speech.sentence_silence,
        )

    def _language_options(self, model: SpeechModel, language: str | None) -> dict[str, Any]:
        """The model options for a requested language: a multilingual model takes it as its
        `language` option (the engine checks it); any other must speak it already."""
        if not language:
            return {}
        if "language" in model.options:
            return {"language": language}
        spoken = model.languages
        if _base_language(language) not in {_base_language(code) for code in spoken}:
            raise VoiceRefused(
                f"language {language!r} is not spoken by {model.name}; it speaks "
                f"{', '.join(spoken)}: ask for one of those, or leave the language out",
                "language_not_supported",
            )
        return {}


class WyomingHandler(AsyncEventHandler):
    """One client connection."""

    def __init__(self, service: WyomingService, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service = service
        # Voice, markup, speed of the open stream (None: it was refused at its start).
        self._stream_options: dict[str, Any] | None = {}
        self._stream_text: StreamedText | None = None  # not None while a streamed text is open
        self._stream_chars = 0  # characters received in the open streamed text
        # What to say goes through one queue to one speaker task, in order, so that this
        # connection keeps reading events (a streamed text's bound, describe) while it speaks.
        self._queue: asyncio.Queue[Speech | None] = asyncio.Queue()
        self._speaker: asyncio.Task | None = None
        self._client_gone = False
        self._pending = 0  # queued items not yet done: the idle clock waits for them
        self._idle = asyncio.Event()
        self._idle.set()

    def _enqueue(self, speech: Speech | None) -> None:
        """Queue `speech`, or (None) the synthesize-stopped that ends a streamed text."""
        if self._speaker is None or self._speaker.done():
            self._speaker = asyncio.create_task(self._speak_queued())
        self._pending += 1
        self._idle.clear()
        self._queue.put_nowait(speech)

    def _enqueue_pieces(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            options = {**self._stream_options, "ssml": piece.ssml}
            self._enqueue(Speech(piece.text, **options))

    async def _speak_queued(self) -> None:
        while True:
            speech = await self._queue.get()
            try:
                if speech is None:
                    await self._send(Event(type="synthesize-stopped"))
                elif not await self._speak(speech):
                    self._client_gone = True
                    return
            except (ConnectionError, BrokenPipeError):
                self._client_gone = True
                return
            except Exception as error:  # one line and an error event, never a dead speaker
                log.error("wyoming synthesis failed: %s: %s", type(error).__name__, one_line(error))
                with contextlib.suppress(ConnectionError, BrokenPipeError):
                    await self._error(f"synthesis failed: {one_line(error)}", "internal_error")
            finally:
                self._pending -= 1
                if self._pending <= 0:
                    self._idle.set()

    def _drop_queued(self) -> None:
        """Stop speaking and forget what was queued (the stream broke its bound, or the
        client left)."""
        if self._speaker is not None:
            self._speaker.cancel()
            self._speaker = None
        self._queue = asyncio.Queue()
        self._pending = 0
        self._idle.set()

    async def _finish_queued(self) -> None:
        """Speak everything queued (a client that half-closed its side after sending still
        reads the answer), unless the client is gone meanwhile."""
        speaker = self._speaker
        if speaker is None or speaker.done() or self._pending <= 0:
            return
        idle = asyncio.ensure_future(self._idle.wait())
        try:
            await asyncio.wait({speaker, idle}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()

    async def run(self) -> None:
        # The library's loop, reading through bounded, timed reads (wyoming_events); a client
        # that sends something unreadable, or part of an event, gets an error event and is
        # disconnected, one that stays silent is disconnected (one log line each).
        config = self.service.config
        try:
            while True:
                try:
                    first = await first_byte(
                        self.reader, config.idle_timeout, lambda: self._pending > 0, self._idle
                    )
                    event = await read_event(self.reader, config.header_timeout, first)
                except IdleTimeout as error:
                    log.info("wyoming client closed: %s", error)
                    break
                except BadEvent as error:
                    log.info("wyoming client refused: %s", error)
                    self._drop_queued()
                    await self._send(Error(text=str(error), code="bad_event").event())
                    await self._linger()
                    break
                if event is None:  # the client's side is closed: answer what it asked
                    await self._finish_queued()
                    break
                if not await self.handle_event(event):
                    break
        except (ConnectionError, BrokenPipeError):
            log.info("wyoming client went away")
        finally:
            self._drop_queued()
            with contextlib.suppress(Exception):
                self.writer.close()

    async def _linger(self) -> None:
        """Close our side first and discard what the client is still sending (bounded), so
        the error event is read before the connection goes: closing with unread input would
        reset it and could drop the error on the client's side."""
        with contextlib.suppress(Exception):
            if self.writer.can_write_eof():
                self.writer.write_eof()

            async def discard() -> None:
                for _ in range(64):  # at most 64 x 64 KiB
                    if not await self.reader.read(65536):
                        return

            await asyncio.wait_for(discard(), timeout=2.0)

    async def _send(self, event: Event) -> None:
        await async_write_event(event, self.writer)

    async def handle_event(self, event: Event) -> bool:
        problem = malformed(event)
        if problem:  # one error event; the connection stays open (the event was whole)
            log.info("wyoming client sent a malformed %s event: %s", event.type, problem)
            await self._error(f"malformed {event.type} event: {problem}", "bad_event")
            if SynthesizeStart.is_type(event.type) and self._stream_text is None:
                self._refuse_stream()
            return True
        if Describe.is_type(event.type):
            await self._send(self.service.info().event())
            return True
        if SynthesizeStart.is_type(event.type):
            if self._stream_text is not None:
                await self._error("synthesize-start while a streamed text is open", "bad_order")
                return True
            self._stream_chars = 0
            try:
                self._stream_options = event_options(event.data or {})
            except InputError as error:
                self._refuse_stream()
                await self._error(str(error), error_code(error))
                return True
            self._stream_text = StreamedText(self._stream_options["ssml"])
            return True
        if SynthesizeChunk.is_type(event.type):
            if self._stream_text is None:
                await self._error("synthesize-chunk before synthesize-start", "bad_order")
                return True
            chunk = SynthesizeChunk.from_event(event).text
            self._stream_chars += len(chunk)  # the whole stream is bounded, spoken or not
            if self._stream_chars > MAX_STREAM_CHARS:
                self._drop_queued()
                await self._error(f"a streamed text holds at most {MAX_STREAM_CHARS} characters")
                self._stream_text = None
                return True
            if self._stream_options is None:
                return True  # a refused stream: its error was sent at its start
            self._enqueue_pieces(self._stream_text.add(chunk))
            if self._stream_text.ssml and self._stream_text.pending > MAX_INPUT_CHARS:
                # An SSML document is spoken whole, so it is bounded like one text.
                self._drop_queued()
                await self._error(
                    f"a streamed SSML document holds at most {MAX_INPUT_CHARS} characters (it "
                    "is spoken whole when the stream ends); stream plain text, or send shorter "
                    "documents",
                    "too_long",
                )
                self._stream_text = None
            return not self._client_gone
        if SynthesizeStop.is_type(event.type):
            if self._stream_text is None:
                await self._error("synthesize-stop before synthesize-start", "bad_order")
                return True
            text, self._stream_text = self._stream_text, None
            if self._stream_options is not None:
                self._enqueue_pieces(text.finish())
                if self._stream_chars and not text.spoken:  # only whitespace: said so
                    self._enqueue(Speech("", **self._stream_options))
            self._enqueue(None)
            return not self._client_gone
        if Synthesize.is_type(event.type):
            if self._stream_text is not None:
                return True  # sent beside a stream for older servers; the stream speaks
            synthesize = Synthesize.from_event(event)
            try:
                options = event_options(event.data or {})
            except InputError as error:
                await self._error(str(error), error_code(error))
                return True
            self._enqueue(Speech(synthesize.text, **options))
            return not self._client_gone
        return True  # events for other services are not ours

    def _refuse_stream(self) -> None:
        """A stream whose start was refused (its error sent): open, so that its chunks are
        dropped quietly and its stop is answered with synthesize-stopped."""
        self._stream_options = None
        self._stream_text = StreamedText()
        self._stream_chars = 0

    async def _error(self, text: str, code: str = "invalid_request") -> None:
        await self._send(Error(text=text, code=code).event())

    async def _speak(self, speech: Speech) -> bool:
        """Generate `speech` and send its audio as it comes; False when the client left."""
        text = speech.text
        if not text.strip():
            await self._error("nothing to say: the text is empty", "empty_text")
            return True
        if len(text) > MAX_INPUT_CHARS:
            await self._error(f"a text holds at most {MAX_INPUT_CHARS} characters", "too_long")
            return True
        service = self.service
        try:
            job = await blocking(service.plan, speech)
        except VoiceRefused as error:
            log.info("wyoming voice refused: %s", error)
            await self._error(str(error), error.code)
            return True
        voice_name = speech.voice
        record = SynthesisRecord(
            request_id=uuid.uuid4().hex[:16],
            model=job.model.name,
            voice=voice_name or "default",
            characters=len(text),
            response_format="wyoming",
        )
        try:
            await job.admit(QUEUE_TIMEOUT_SECONDS)
        except Busy as error:
            await self._error(str(error), "busy")
            return True
        job.start()
        rate = job.output_rate
        audio = {"rate": rate, "width": 2, "channels": 1}
        started = False
        try:
            while True:
                kind, payload = await job.events.get()
                if kind == AUDIO:
                    if not started:
                        record.first_audio = time.perf_counter() - job.received_at
                        await self._send(AudioStart(**audio).event())
                        started = True
                    record.audio_seconds += len(payload) / rate
                    pcm = to_pcm16(np.asarray(payload, np.float32))
                    await self._send(AudioChunk(audio=pcm, **audio).event())
                elif kind == END:
                    if not started:
                        await self._send(AudioStart(**audio).event())
                    await self._send(AudioStop().event())
                    record.outcome = "done"
                    return True
                elif kind == ERROR:
                    record.outcome = "error"
                    await self._error(one_line(payload), error_code(payload))
                    return True
        except (ConnectionError, BrokenPipeError):
            log.info("wyoming client went away; generation %s stopped", record.request_id)
            return False
        finally:
            job.cancel()
            record.log(job.cache_hit)


def _base_language(code: str) -> str:
    """The language of a tag without its region: "en_US" and "EN-gb" are "en"."""
    return code.lower().replace("_", "-").split("-")[0]


def _version() -> str:
    from onnx_tts import __version__

    return __version__


def _check_uri(uri: str) -> None:
    """InputError unless `uri` is tcp://HOST:PORT with a port in 0-65535."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        port = None
        parts = None
    if parts is None or parts.scheme != "tcp" or not parts.hostname or port is None:
        raise InputError(f"--uri must be tcp://HOST:PORT with a port in 0-65535, got {uri!r}")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (exit 0); 2 with one line for bad arguments, a model that
    cannot load or an address in use."""
    from onnx_tts.cache.codec import resolve_cache_secret
    from onnx_tts.config import from_flags
    from onnx_tts.flags import engine_configs, family_options, folder_options
    from onnx_tts.server.app import default_voices_dir
    from onnx_tts.server.cli import configure_logging
    from onnx_tts.server.redis_voices import open_voice_store

    try:
        config = from_flags(WyomingConfig, args)
        engine, caches = engine_configs(args)
        _check_uri(config.uri)
        # The HTTP server's voices: its directory, or its Redis (with its secret).
        voices = open_voice_store(
            config.voices_dir or default_voices_dir(),
            caches.redis_url,
            resolve_cache_secret(caches.cache_secret),
        )
    except OnnxTTSError as error:
        print(f"onnx-tts wyoming: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_json)
    registry = ModelRegistry(
        [engine.model],
        engine,
        caches,
        family_options(args),
        max_streams=config.max_streams,
        folders=folder_options(args),
    )
    try:
        registry.load_all()
    except Exception as error:
        print(f"onnx-tts wyoming: cannot load the model: {one_line(error)}", file=sys.stderr)
        return 2
    service = WyomingService(registry, voices, config)
    try:
        return asyncio.run(_serve(service, config.uri))
    except OSError as error:
        print(f"onnx-tts wyoming: cannot listen on {config.uri}: {error}", file=sys.stderr)
        return 2


async def _serve(service: WyomingService, uri: str) -> int:
    server = AsyncServer.from_uri(uri)
    assert isinstance(server, AsyncTcpServer)
    await server.start(lambda reader, writer: WyomingHandler(service, reader, writer))
    log.info("wyoming: listening on %s (model %s)", uri, service.model.name)
    trimming = asyncio.create_task(trim_idle_threads())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in handled_signals():  # as SIGTERM, but one started ignored (nohup)
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("wyoming: stopping")
    trimming.cancel()
    await server.stop()
    service.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    from onnx_tts.server.cli import add_wyoming_arguments

    parser = add_wyoming_arguments(argparse.ArgumentParser(prog="onnx-tts wyoming"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
