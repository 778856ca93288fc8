"""The server's one view of the engine: load models, encode voices, open a stream.

Every call into onnx_tts.Engine goes through this module, so a rename in the engine or the
batch scheduler replacing `Engine.stream` is a change here only.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import onnx_tts
from onnx_tts.audio import Trimmed, load_audio
from onnx_tts.config import CacheConfig, EngineConfig
from onnx_tts.families.base import FolderModel
from onnx_tts.pipeline import available_cores, build_engine
from onnx_tts.pipeline.admission import Admission, retry_after_seconds
from onnx_tts.pipeline.execution import ReadyChunks
from onnx_tts.vocoder import STREAMING_KEYS

# Names OpenAI clients send for "the server's default model".
DEFAULT_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "onnx-tts", "default")
# Models of a folder (a family's folder flag) loaded at once at most, besides the default:
# the least recently used idle one is let go for the next (a joe-size voice holds ~150 MB).
MAX_LOADED_FOLDER_MODELS = 3


@dataclass(eq=False)
class SpeechModel:
    """One loaded model, named as clients address it, with its admission control and the
    requests it is serving."""

    name: str
    engine: onnx_tts.Engine
    path: str = ""
    created: int = 0
    options: dict[str, type] = field(default_factory=dict)  # extension field -> JSON type
    admission: Admission | None = None
    jobs: dict[int, Any] = field(default_factory=dict)  # active Generations by id
    _stream_seconds: float = 5.0  # running mean of a request's audio (for Retry-After)
    _stalls_done: int = 0  # long underruns of the listeners of finished requests

    def admit_streams(self, max_streams: int, max_waiting: int) -> None:
        """Admission control from the engine's stage utilisation and its listeners' lead."""
        engine = self.engine

        def busy() -> tuple[float, ...]:
            stats = engine.stats()
            return (stats["busy_seconds"], stats["vocoder"]["busy_seconds"])

        def audio() -> float:
            return engine.stats()["vocoder"]["samples"] / engine.sample_rate

        self.admission = Admission(
            busy,
            audio,
            max_streams,
            max_waiting,
            lead=self.lead,
            cores=available_cores(),
            stalls=self.stalls,
            policy=engine.scheduler.policy,
        )

    def stalls(self) -> int:
        """Underruns of this model's listeners so far that a player buffering 0.1 s would hear
        too (finished requests and active ones): the server's clock is strict, and a short
        gap at a stream's first seam, which any player's buffer absorbs, held admission back
        for nothing (`bench serve`)."""
        jobs = list(self.jobs.values())
        return self._stalls_done + sum(job.clock.long_underruns for job in jobs)

    def lead(self, arrived: float | None = None) -> float | None:
        """Seconds until the first of this model's listeners that played at `arrived`
        (perf_counter; None: any) runs dry; None when none plays."""
        now = time.perf_counter()
        clocks = [job.clock for job in list(self.jobs.values())]
        times = [
            clock.runs_dry_at()
            for clock in clocks
            if clock.start is not None and (arrived is None or clock.start <= arrived)
        ]
        return min(times) - now if times else None

    def track(self, job: Any) -> None:
        self.jobs[id(job)] = job

    def untrack(self, job: Any) -> None:
        if self.jobs.pop(id(job), None) is not None and self.admission is not None:
            self._stalls_done += job.clock.long_underruns
            self.admission.release()
            seconds = job.generated_samples / self.sample_rate
            self._stream_seconds += 0.2 * (seconds - self._stream_seconds)

    def retry_after(self) -> int:
        active = self.admission.active if self.admission is not None else 0
        return retry_after_seconds(self._stream_seconds, active)

    @property
    def sample_rate(self) -> int:
        return int(self.engine.sample_rate)

    def batch_rows(self) -> int:
        """Requests decoding as rows of the engine's current LM step (1 without batching)."""
        return max(1, int(self.engine.stats().get("active_rows", 1)))

    @property
    def channels(self) -> int:
        """Channels of the model's audio (2 for a stereo codec)."""
        return self.engine.channels

    @property
    def languages(self) -> list[str]:
        """Languages the model speaks, as its info() declares them (English when it says
        nothing)."""
        info = self.engine.info()
        return [str(code) for code in info.get("languages") or [info.get("language") or "en"]]

    @property
    def hop_length(self) -> int:
        return int(self.engine.model.hop_length)

    @property
    def builtin_voices(self) -> list[str]:
        """Voices the model itself ships (its family's builtin voices), by name."""
        return list(self.engine.voice_names)

    @property
    def voice_rate(self) -> int:
        return int(self.engine.model.encoder.sample_rate)

    def voice_limits(self) -> tuple[float | None, float | None]:
        encoder = self.engine.model.encoder
        return encoder.min_seconds, encoder.max_seconds

    def decode_voice(self, data: bytes, on_trim: Trimmed | None = None) -> np.ndarray:
        """An uploaded clip's bytes -> mono float32 at this model's encoder rate (AudioError
        naming it audio_sample if bad); a clip longer than the encoder takes is cut, told to
        `on_trim` (else a warning)."""
        low, high = self.voice_limits()
        return load_audio(
            data,
            self.voice_rate,
            min_seconds=low,
            max_seconds=high,
            on_trim=on_trim,
            name="audio_sample",
        )

    def encode_voice(self, audio: np.ndarray | str | None) -> dict[str, np.ndarray]:
        """Encoder outputs through the content-addressed reference cache (None = default, a
        string = one of `builtin_voices`)."""
        return self.engine.voice(audio)

    def stream(
        self,
        text: str,
        voice: dict[str, np.ndarray] | None,
        seed: int | None,
        options: dict[str, Any],
        **timing: Any,
    ) -> Any:
        """float32 chunks as the windowed vocoder yields them (an AudioStream, pollable);
        text and options are checked before this returns (InputError); `timing`: deadline,
        clock, cancel (see Engine.stream). Closing the stream stops generation."""
        return self.engine.stream(text, voice=voice, seed=seed, **timing, **options)

    @staticmethod
    def replayed(stream: Any) -> bool:
        """Whether `stream` (from stream()) replays a result-cache hit instead of generating."""
        return isinstance(stream, ReadyChunks)

    def cache_stats(self) -> dict[str, Any]:
        return self.engine.cache_stats()


def model_options(engine: onnx_tts.Engine) -> dict[str, type]:
    """Request fields a model takes beyond OpenAI's (its sampling options, its family's
    per-request options and stream windows), each with its type."""
    sampling = engine.model.sampling_defaults()
    options: dict[str, type] = {}
    for item in dataclasses.fields(sampling):
        if item.name != "seed":
            default = getattr(sampling, item.name)
            options[item.name] = type(default) if isinstance(default, (int, float)) else str
    for option in engine.family.options_in("request"):
        options[option.name] = option.kind
    options.update(dict.fromkeys(STREAMING_KEYS, int))  # every model streams
    options["cache"] = bool  # result cache: also a sampled request (True), or bypass (False)
    return options


class ModelRegistry:
    """Models by name; the first one loaded is the default. Loading runs in the background so
    /health can say 503 until every model is ready. Models of a folder (`folders`: a family's
    folder flag -> its directory, e.g. a Home Assistant voices folder) are listed at once and
    loaded when first asked for (`get`), at most MAX_LOADED_FOLDER_MODELS of them at a time;
    without --model the folder's first model is the default."""

    def __init__(
        self,
        model_dirs: Sequence[str | None],
        engine: EngineConfig | None = None,
        caches: CacheConfig | None = None,
        family_options: dict[str, Any] | None = None,
        max_streams: int = 64,
        max_waiting: int = 64,
        folders: dict[str, str] | None = None,
    ) -> None:
        self.folders = dict(folders or {})
        self.model_dirs = list(model_dirs) or [None]
        if self.folders and self.model_dirs == [None]:
            self.model_dirs = []  # the folder's first model is the default, not the bundled one
        self.max_streams, self.max_waiting = max_streams, max_waiting
        self.engine_config = engine or EngineConfig()
        self.caches = caches or CacheConfig()
        self.family_options = dict(family_options or {})
        self.models: dict[str, SpeechModel] = {}
        self.default: SpeechModel | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.folder_models: dict[str, FolderModel] = {}  # by name, loaded or not
        self._folder_lock = threading.Lock()
        self._last_used: dict[str, float] = {}

    def _load(self, model_dir: str | None, name: str | None = None) -> SpeechModel:
        config = dataclasses.replace(self.engine_config, model=model_dir)
        engine = build_engine(config, self.caches, family_options=self.family_options)
        name = name or str(engine.info().get("name") or Path(str(model_dir)).name)
        if name in self.models:  # two bundles with one name: keep both reachable
            name = f"{name}-{len(self.models)}"
        model = SpeechModel(
            name=name,
            engine=engine,
            path=str(engine.info().get("path", model_dir or "")),
            created=int(time.time()),
            options=model_options(engine),
        )
        model.admit_streams(self.max_streams, self.max_waiting)
        self.models[name] = model
        if self.default is None:
            self.default = model
        return model

    def load_all(self) -> None:
        try:
            from onnx_tts.families import folder_scanners

            scanners = folder_scanners()
            for option, folder in self.folders.items():
                for entry in scanners[option](Path(folder)):
                    self.folder_models.setdefault(entry.name, entry)
            for model_dir in self.model_dirs:
                self._load(model_dir)
            if self.default is None and self.folder_models:
                first = next(iter(self.folder_models.values()))
                self._load(str(first.path), first.name)
        except Exception as error:  # reported by /health, the server keeps answering
            self.error = f"{type(error).__name__}: {error}"
            raise
        finally:
            self.ready.set()

    @property
    def loaded(self) -> bool:
        return self.ready.is_set() and self.error is None and self.default is not None

    def get(self, name: str) -> SpeechModel | None:
        """The model of `name` (an alias: the default); a folder's model is loaded now if it is
        not yet (blocking: call from a worker thread)."""
        if name in self.models:
            self._last_used[name] = time.monotonic()
            return self.models[name]
        if name in DEFAULT_MODEL_ALIASES:
            return self.default
        entry = self.folder_models.get(name)
        if entry is None:
            return None
        with self._folder_lock:
            if name not in self.models:
                self._make_room()
                self._load(str(entry.path), name)
            self._last_used[name] = time.monotonic()
            return self.models[name]

    def _make_room(self) -> None:
        """(under the folder lock) let the least recently used idle folder models go until one
        more fits; models serving requests, and the default, stay."""
        loaded = [
            n for n in self.models if n in self.folder_models and self.models[n] is not self.default
        ]
        while len(loaded) >= MAX_LOADED_FOLDER_MODELS:
            idle = [n for n in loaded if not self.models[n].jobs]
            if not idle:
                return  # every one is speaking: this one joins them, the bound waits for them
            oldest = min(idle, key=lambda n: self._last_used.get(n, 0.0))
            model = self.models.pop(oldest)
            loaded.remove(oldest)
            model.engine.close()

    def names(self) -> list[str]:
        """The models clients may ask for: those loaded and every folder model."""
        return list(dict.fromkeys([*self.models, *self.folder_models]))

    def stage_stats(self) -> dict[str, dict[str, Any]]:
        """model -> its engine's stage counters (and its admission's), for /metrics."""
        stats = {}
        for name, model in list(self.models.items()):
            stats[name] = model.engine.stats()
            if model.admission is not None:
                stats[name]["admission"] = model.admission.stats()
        return stats

    def cache_stats(self) -> dict[str, dict[str, dict[str, Any]]]:
        """model -> {"reference", "result", "prefix"} -> that cache's stats ({} when off), for
        /metrics."""
        return {name: model.cache_stats() for name, model in self.models.items()}
