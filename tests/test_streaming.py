"""Streaming (issue 5): windowed vocoder, Engine.stream(), batching windows of several streams.

Two vocoders are used:
- the reference bundle's causal ONNX vocoder (left context 7 frames, no look-ahead), through
  the real Engine;
- a small non-causal numpy vocoder built here (left context 2, look-ahead 2 frames) whose
  output is smooth, so that a badly stitched seam shows up as a jump (negative controls).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from onnx_tts.errors import InputError, ModelError
from onnx_tts.families.codec_lm import CodecVocoder as Vocoder
from onnx_tts.vocoder import (
    StreamingDecoder,
    StreamingOptions,
    decode_streams,
    stream_decode,
)
from tests.waiting import WAIT_BOUND_SECONDS, wait_until

TEXT = "Hello there. How are you today? The weather is fine."
ONE_SENTENCE = "Streaming starts long before the sentence is done."
REFERENCE_RECEPTIVE_FIELD = 7  # bundle.json vocoder.receptive_field_frames


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    error = np.sum((reference.astype(np.float64) - estimate) ** 2)
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / max(error, 1e-30)))


def seam_positions(chunks: list[np.ndarray], crossfade: int) -> np.ndarray:
    """Sample indices where a chunk starts, and where each crossfade ends."""
    starts = np.cumsum([len(c) for c in chunks])[:-1]
    seams = np.concatenate([starts, starts + crossfade]) if crossfade else starts
    total = sum(len(c) for c in chunks)
    return np.unique(seams[(seams > 0) & (seams < total)])


def worst_seam_ratio(chunks: list[np.ndarray], crossfade: int) -> float:
    """Largest jump across a seam divided by the signal's own 99.9th-percentile jump."""
    signal = np.concatenate(chunks)
    jumps = np.abs(np.diff(signal.astype(np.float64)))
    seams = seam_positions(chunks, crossfade)
    assert len(seams), "need at least one seam to check"
    return float(jumps[seams - 1].max() / np.percentile(jumps, 99.9))


# ---------------------------------------------------------------------------------------------
# A non-causal toy vocoder: frame t depends on frames t-2 .. t+2 (zero outside the window it
# is given, like a zero-padded convolution), output is a smooth envelope times a cosine.

TOY_HOP = 64
TOY_CODEBOOKS = 2
TOY_CODEBOOK_SIZE = 32
TOY_LEFT = 2
TOY_LOOKAHEAD = 2


class ToyVocoderSession:
    """Stands in for an ORT session with the vocoder I/O; counts its runs."""

    def __init__(self) -> None:
        self.runs = 0
        self.batch_sizes: list[int] = []

    def run(self, feeds: dict[str, np.ndarray], output_names: Any = None) -> dict[str, Any]:
        self.runs += 1
        codes = feeds["codes"]
        self.batch_sizes.append(codes.shape[0])
        return {"waveform": np.stack([self._decode_one(c) for c in codes])}

    @staticmethod
    def _decode_one(codes: np.ndarray) -> np.ndarray:
        frames = len(codes)
        level = 0.3 + codes[:, 0] / TOY_CODEBOOK_SIZE + 0.5 * (codes[:, 1] / TOY_CODEBOOK_SIZE)
        padded = np.concatenate([np.zeros(TOY_LEFT), level, np.zeros(TOY_LOOKAHEAD)])
        # m[t] averages frames t-2 .. t+1; frame t interpolates m[t] -> m[t+1] (sees t+2).
        smooth = np.convolve(padded, np.ones(4) / 4, mode="valid")  # len frames + 1
        ramp = np.arange(TOY_HOP) / TOY_HOP
        envelope = smooth[:frames, None] * (1 - ramp) + smooth[1 : frames + 1, None] * ramp
        carrier = np.cos(2 * np.pi * np.arange(TOY_HOP) / TOY_HOP)
        return (0.4 * envelope * carrier).reshape(-1).astype(np.float32)


def toy_vocoder(lookahead: int | None = TOY_LOOKAHEAD) -> tuple[Vocoder, ToyVocoderSession]:
    session = ToyVocoderSession()
    vocoder = Vocoder(session, TOY_HOP, TOY_CODEBOOKS, TOY_CODEBOOK_SIZE, 16000, lookahead)  # type: ignore[arg-type]
    return vocoder, session


def toy_frames(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, TOY_CODEBOOK_SIZE, (count, TOY_CODEBOOKS))


def toy_stream(frames: np.ndarray, **options: int) -> list[np.ndarray]:
    vocoder, _ = toy_vocoder()
    params = StreamingOptions(**options)
    return list(stream_decode(iter(frames), vocoder.decode, params, TOY_HOP))


TOY_EXACT = dict(
    first_chunk_frames=6,
    stride_frames=10,
    overlap_frames=3,
    holdback_frames=2,
    crossfade_samples=64,
)


def test_toy_vocoder_is_really_non_causal() -> None:
    # Guard for the tests below: the toy must depend on look-ahead, or they prove nothing.
    vocoder, _ = toy_vocoder()
    frames = toy_frames(20, seed=0)
    changed = frames.copy()
    changed[10, 0] = (changed[10, 0] + 7) % TOY_CODEBOOK_SIZE
    difference = np.abs(vocoder.decode(frames) - vocoder.decode(changed)).reshape(20, TOY_HOP)
    touched = np.flatnonzero(difference.max(axis=1) > 1e-6)
    assert touched.min() == 10 - TOY_LOOKAHEAD and touched.max() == 10 + TOY_LEFT


@pytest.mark.parametrize("count", [0, 1, 5, 6, 7, 16, 17, 40, 83])
def test_toy_stream_with_enough_context_is_exact(count: int) -> None:
    frames = toy_frames(count, seed=count)
    vocoder, _ = toy_vocoder()
    chunks = toy_stream(frames, **TOY_EXACT)
    streamed = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    assert len(streamed) == count * TOY_HOP
    assert all(c.dtype == np.float32 and len(c) for c in chunks)
    np.testing.assert_allclose(streamed, vocoder.decode(frames), rtol=0, atol=1e-6)


def test_holdback_supplies_the_lookahead() -> None:
    frames = toy_frames(60, seed=1)
    vocoder, _ = toy_vocoder()
    one_shot = vocoder.decode(frames)
    exact = np.concatenate(toy_stream(frames, **TOY_EXACT))
    # Without hold-back every window ends blind to the next frames: same length, but wrong.
    blind_options = {**TOY_EXACT, "holdback_frames": 0}
    blind = np.concatenate(toy_stream(frames, **blind_options))
    assert len(blind) == len(one_shot)
    assert np.abs(blind - one_shot).max() > 1e-3
    np.testing.assert_allclose(exact, one_shot, rtol=0, atol=1e-6)
    # One frame of hold-back is half the look-ahead: better, still not exact.
    half = np.concatenate(toy_stream(frames, **{**TOY_EXACT, "holdback_frames": 1}))
    assert snr_db(one_shot, blind) < snr_db(one_shot, half) < snr_db(one_shot, exact)


def test_seam_check_catches_clicks_and_crossfade_removes_them() -> None:
    frames = toy_frames(120, seed=2)
    # Negative control: no overlap, no hold-back, no crossfade -> visible jumps at seams.
    naive = toy_stream(
        frames,
        first_chunk_frames=6,
        stride_frames=10,
        overlap_frames=0,
        holdback_frames=0,
        crossfade_samples=0,
    )
    assert worst_seam_ratio(naive, 0) > 1.5
    # Too little context for exactness, but the crossfade hides the seam.
    short = dict(
        first_chunk_frames=6,
        stride_frames=10,
        overlap_frames=2,
        holdback_frames=1,
        crossfade_samples=2 * TOY_HOP,
    )
    # Same windows without the crossfade: the seams click again (how loud depends on where the
    # seams fall in the signal, so over several signals).
    clicks = []
    for seed in range(2, 6):
        signal = toy_frames(120, seed=seed)
        faded = worst_seam_ratio(toy_stream(signal, **short), 2 * TOY_HOP)
        bare = worst_seam_ratio(toy_stream(signal, **{**short, "crossfade_samples": 0}), 0)
        assert faded <= 1.0 and bare > 10 * faded, (seed, faded, bare)
        clicks.append(bare)
    assert np.mean(clicks) > 1.5
    assert worst_seam_ratio(toy_stream(frames, **TOY_EXACT), 64) <= 1.0


def test_windows_sit_at_fixed_frame_counts_whatever_the_arrival_pattern() -> None:
    frames = toy_frames(50, seed=3)
    params = StreamingOptions(**TOY_EXACT)
    vocoder, _ = toy_vocoder()

    def run(batches: list[int], grow: bool = True) -> list[np.ndarray]:
        decoder = StreamingDecoder(params, TOY_HOP, grow=grow)
        out, position = [], 0
        for size in batches:
            decoder.push(frames[position : position + size])
            position += size
            while (window := decoder.next_window()) is not None:
                out.append(decoder.accept(window, vocoder.decode(window.codes)))
        decoder.finish()
        while (window := decoder.next_window()) is not None:
            codes = window.codes
            out.append(decoder.accept(window, vocoder.decode(codes) if len(codes) else []))
        return [c for c in out if len(c)]

    one_by_one = run([1] * 50)
    in_bursts = run([7, 13, 1, 29])
    assert [len(c) for c in one_by_one] == [len(c) for c in in_bursts]
    for a, b in zip(one_by_one, in_bursts, strict=True):
        np.testing.assert_array_equal(a, b)
    # First chunk: frames 0..first-holdback, less the crossfade tail kept for the next seam.
    first = TOY_EXACT["first_chunk_frames"] - TOY_EXACT["holdback_frames"]
    assert len(one_by_one[0]) == first * TOY_HOP - TOY_EXACT["crossfade_samples"]
    # Then each window adds as many frames as were emitted before it (4, then 8), up to the
    # stride (10): the listener always holds about what the next window has to generate.
    assert [len(c) // TOY_HOP for c in one_by_one[1:-1]] == [4, 8, 10, 10, 10]
    # A stream read as fast as it is made keeps the fixed stride from the start.
    fixed = run([1] * 50, grow=False)
    assert [len(c) // TOY_HOP for c in fixed[1:-1]] == [10, 10, 10, 10]
    assert np.array_equal(np.concatenate(fixed), np.concatenate(run([50], grow=False)))


def test_decode_windows_groups_equal_lengths_and_matches_single_decodes() -> None:
    vocoder, session = toy_vocoder()
    windows = [toy_frames(n, seed=n) for n in (12, 5, 12, 0, 5, 12, 30)]
    batched = vocoder.decode_windows(windows)
    assert session.runs == 3  # lengths 12, 5, 30; the empty window needs no call
    assert sorted(session.batch_sizes) == [1, 2, 3]
    for codes, waveform in zip(windows, batched, strict=True):
        np.testing.assert_array_equal(waveform, vocoder.decode(codes))


def test_decode_windows_pads_into_one_call_only_for_a_causal_vocoder(codec_lm_engine) -> None:
    reference = codec_lm_engine.model.vocoder

    class CountingSession:
        def __init__(self) -> None:
            self.runs = 0

        def run(self, feeds: dict[str, np.ndarray], output_names: Any = None) -> Any:
            self.runs += 1
            return reference.session.run(feeds, output_names)

    rng = np.random.default_rng(4)
    windows = [
        rng.integers(0, reference.codebook_size, (n, reference.codebooks))
        for n in (3, 40, 17, 40, 1)
    ]
    counting = CountingSession()
    causal = Vocoder(
        counting,  # type: ignore[arg-type]
        reference.hop_length,
        reference.codebooks,
        reference.codebook_size,
        reference.capabilities.sample_rate,
        0,
    )
    batched = causal.decode_windows(windows)
    assert counting.runs == 1
    for codes, waveform in zip(windows, batched, strict=True):
        assert len(waveform) == len(codes) * reference.hop_length
        np.testing.assert_allclose(waveform, reference.decode(codes), rtol=0, atol=1e-5)
    unknown = Vocoder(
        counting,  # type: ignore[arg-type]
        reference.hop_length,
        reference.codebooks,
        reference.codebook_size,
        reference.capabilities.sample_rate,
    )
    unknown.decode_windows(windows)
    assert counting.runs == 1 + 4  # lookahead unknown: equal lengths only (3, 40, 17, 1)


def test_several_streams_share_one_vocoder_call_per_round() -> None:
    vocoder, session = toy_vocoder()
    params = StreamingOptions(**TOY_EXACT)
    lengths = (45, 23, 70)
    all_frames = [toy_frames(n, seed=10 + n) for n in lengths]
    decoders = [StreamingDecoder(params, TOY_HOP) for _ in lengths]
    outputs: list[list[np.ndarray]] = [[] for _ in lengths]
    for step in range(max(lengths) + 1):
        for decoder, frames in zip(decoders, all_frames, strict=True):
            if step < len(frames):
                decoder.push(frames[step])
            elif step == len(frames):
                decoder.finish()
        while any(d.next_window() is not None for d in decoders):
            due = [w for d in decoders if (w := d.next_window()) is not None and len(w.codes)]
            before = session.runs
            released = decode_streams(vocoder, decoders)
            # One call per distinct window length (the toy has look-ahead, so no padding).
            assert session.runs - before == len({len(w.codes) for w in due})
            for out, chunk in zip(outputs, released, strict=True):
                if chunk is not None and len(chunk):
                    out.append(chunk)
    assert all(d.done for d in decoders)
    assert max(session.batch_sizes) >= 2  # some windows of different streams were batched
    for out, frames in zip(outputs, all_frames, strict=True):
        single = toy_stream(frames, **TOY_EXACT)
        np.testing.assert_array_equal(np.concatenate(out), np.concatenate(single))


def test_pushing_after_finish_and_out_of_order_accept_are_errors() -> None:
    decoder = StreamingDecoder(StreamingOptions(**TOY_EXACT), TOY_HOP)
    decoder.push(toy_frames(20, seed=5))
    window = decoder.next_window()
    assert window is not None
    with pytest.raises(InputError, match="samples"):
        decoder.accept(window, np.zeros(3, np.float32))
    decoder.finish()
    with pytest.raises(InputError, match="after finish"):
        decoder.push(toy_frames(1, seed=6))


# ---------------------------------------------------------------------------------------------
# Option checking


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stride_frames": 4, "overlap_frames": 8}, "stride_frames .4. must be >= overlap"),
        ({"overlap_frames": 1, "crossfade_samples": 481}, "crossfade_samples .481. must fit"),
        ({"first_chunk_frames": 2, "holdback_frames": 2}, "first chunk would be empty"),
        ({"first_chunk_frames": 0}, "must be >= 1"),
        ({"holdback_frames": -1}, "must be >= 0"),
        ({"stride_frames": 2.5}, "stride_frames must be an integer"),
    ],
)
def test_bad_window_options_are_rejected_before_any_work(
    codec_lm_engine, monkeypatch, overrides: dict[str, Any], message: str
) -> None:
    def no_generation(*args: Any, **kwargs: Any) -> Iterator[np.ndarray]:
        raise AssertionError("generation must not start with bad options")

    monkeypatch.setattr(codec_lm_engine.executor, "frames", no_generation)
    with pytest.raises(InputError, match=message):
        codec_lm_engine.stream(ONE_SENTENCE, seed=1, **overrides)  # not even iterated


def test_unknown_streaming_option_is_named() -> None:
    with pytest.raises(InputError, match="overlap_frame"):
        StreamingOptions.resolve({}, 480, overlap_frame=3)


def test_invalid_bundle_defaults_are_a_model_error() -> None:
    broken = {"first_chunk_frames": 8, "stride_frames": 4, "overlap_frames": 8}
    with pytest.raises(ModelError, match="streaming defaults"):
        StreamingOptions.resolve(broken, 480)


def test_bundle_defaults_and_overrides() -> None:
    defaults = {
        "first_chunk_frames": 8,
        "stride_frames": 24,
        "overlap_frames": 8,
        "holdback_frames": 2,
        "crossfade_samples": 480,
    }
    resolved = StreamingOptions.resolve(defaults, 480, stride_frames=30, overlap_frames=None)
    assert resolved == StreamingOptions(8, 30, 8, 2, 480)


# ---------------------------------------------------------------------------------------------
# Engine.stream on the reference bundle


def test_stream_equals_synthesize_exactly_with_enough_overlap(codec_lm_engine) -> None:
    defaults = codec_lm_engine.model.streaming_defaults
    hop = codec_lm_engine.model.hop_length
    # The shipped defaults are wide enough for the causal vocoder: overlap covers the
    # receptive field plus the crossfade, so the stream is the one-shot waveform.
    assert defaults["overlap_frames"] * hop >= (
        REFERENCE_RECEPTIVE_FIELD * hop + defaults["crossfade_samples"]
    )
    one_shot = codec_lm_engine.synthesize(TEXT, seed=3).samples
    chunks = list(codec_lm_engine.stream(TEXT, seed=3))
    assert len(chunks) > 6
    assert all(chunk.dtype == np.float32 and chunk.ndim == 1 for chunk in chunks)
    streamed = np.concatenate(chunks)
    assert len(streamed) == len(one_shot)
    np.testing.assert_allclose(streamed, one_shot, rtol=0, atol=1e-6)
    # The sentence pauses are in the stream, as chunks of their own.
    pause = int(codec_lm_engine.model.vocoder.pause_seconds("") * codec_lm_engine.sample_rate)
    assert sum(1 for c in chunks if len(c) == pause and not c.any()) == 2


def test_stream_with_a_voice_equals_synthesize(codec_lm_engine, voice_wav) -> None:
    one_shot = codec_lm_engine.synthesize(ONE_SENTENCE, voice=voice_wav, seed=7).samples
    streamed = np.concatenate(list(codec_lm_engine.stream(ONE_SENTENCE, voice=voice_wav, seed=7)))
    np.testing.assert_allclose(streamed, one_shot, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("overlap", "crossfade", "min_snr"), [(4, 480, 30.0), (5, 480, 36.0)])
def test_short_overlap_is_close_and_click_free(
    codec_lm_engine, overlap: int, crossfade: int, min_snr: float
) -> None:
    one_shot = codec_lm_engine.synthesize(TEXT, seed=5).samples
    chunks = list(
        codec_lm_engine.stream(TEXT, seed=5, overlap_frames=overlap, crossfade_samples=crossfade)
    )
    streamed = np.concatenate(chunks)
    assert len(streamed) == len(one_shot)
    quality = snr_db(one_shot, streamed)
    assert quality >= min_snr
    assert quality < 80  # too little context to be exact: the crossfade really is at work
    speech = [c for c in chunks if c.any()]  # seams inside sentences, not at the pauses
    assert worst_seam_ratio(speech, crossfade) <= 1.0


class FrameCounter:
    """Counts the frames the LM stage hands to the vocoder stage (and keeps them), the LM
    steps taken, and the length of every window the vocoder decodes."""

    def __init__(self, engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        from onnx_tts.pipeline.stages import VocoderStream

        self.produced: list[np.ndarray] = []
        self.frames = 0
        self.steps = 0
        self.windows: list[int] = []
        program, backend = engine.model.program, engine.model
        original_consume, original_put = program.consume, VocoderStream.put
        original_vocode = backend.vocoder.vocode

        def put(stream: VocoderStream, frame: np.ndarray) -> None:
            self.frames += 1
            self.produced.append(np.array(frame))
            original_put(stream, frame)

        def consume(*args: Any, **kwargs: Any) -> Any:
            self.steps += 1
            return original_consume(*args, **kwargs)

        def vocode(codes: np.ndarray, voice: Any) -> np.ndarray:
            self.windows.append(len(codes))
            return original_vocode(codes, voice)

        monkeypatch.setattr(VocoderStream, "put", put)
        monkeypatch.setattr(program, "consume", consume)
        monkeypatch.setattr(backend.vocoder, "vocode", vocode)


@pytest.mark.parametrize("first_chunk_frames", [4, 8, 15])
def test_first_chunk_comes_after_first_chunk_frames(
    codec_lm_engine, monkeypatch, first_chunk_frames: int
) -> None:
    counter = FrameCounter(codec_lm_engine, monkeypatch)
    stream = codec_lm_engine.stream(ONE_SENTENCE, seed=2, first_chunk_frames=first_chunk_frames)
    first = next(stream)
    assert counter.windows[0] == first_chunk_frames  # the first window: the first N frames
    hop = codec_lm_engine.model.hop_length
    defaults = codec_lm_engine.model.streaming_defaults
    expected = (first_chunk_frames - defaults["holdback_frames"]) * hop - defaults[
        "crossfade_samples"
    ]
    assert len(first) == expected
    rest = list(stream)
    assert counter.frames > 5 * first_chunk_frames  # the sentence is much longer than that
    assert len(first) + sum(len(c) for c in rest) == counter.frames * hop


def test_only_complete_generated_frames_reach_the_vocoder(codec_lm_engine, monkeypatch) -> None:
    backend = codec_lm_engine.model
    original_vocode = backend.vocoder.vocode
    counter = FrameCounter(codec_lm_engine, monkeypatch)
    windows: list[tuple[np.ndarray, int]] = []

    def vocode(codes: np.ndarray, voice: Any) -> np.ndarray:
        windows.append((np.array(codes), counter.frames))
        return original_vocode(codes, voice)

    monkeypatch.setattr(backend.vocoder, "vocode", vocode)  # records what the vocoder receives
    list(codec_lm_engine.stream(ONE_SENTENCE, seed=8))
    produced = np.stack(counter.produced)
    assert len(windows) > 3
    for codes, available in windows:
        # Each window is a run of frames the generator had already yielded, in order.
        assert codes.min() >= 0 and codes.max() < backend.codebook_size
        ends = [
            end
            for end in range(len(codes), available + 1)
            if np.array_equal(produced[end - len(codes) : end], codes)
        ]
        assert ends, "a window holds codes the generator never yielded"


def test_text_shorter_than_one_window(codec_lm_engine, monkeypatch) -> None:
    counter = FrameCounter(codec_lm_engine, monkeypatch)
    chunks = list(codec_lm_engine.stream("Hi.", seed=4, first_chunk_frames=400))
    assert counter.frames < 400
    assert len(chunks) == 1
    one_shot = codec_lm_engine.synthesize("Hi.", seed=4).samples
    np.testing.assert_allclose(chunks[0], one_shot, rtol=0, atol=1e-6)


@pytest.mark.parametrize("max_batch", [1, 8])
def test_cancelled_stream_stops_generation_and_frees_its_row(monkeypatch, max_batch) -> None:
    """Closing a stream cancels its request: the scheduler frees the row before its next
    step. The worker is held inside a step while the consumer closes, so what happens after
    the close is deterministic."""
    import threading

    import onnx_tts
    from tests.conftest import codec_lm_dir

    engine = onnx_tts.load(codec_lm_dir(), kv="inplace", cache_dir=None, max_batch=max_batch)
    program = engine.model.program
    original_consume = program.consume
    steps, hold_at, release = 0, 0, threading.Event()

    def consume(*args: Any, **kwargs: Any) -> Any:
        nonlocal steps
        steps += 1
        if steps == hold_at:
            assert release.wait(WAIT_BOUND_SECONDS)
        return original_consume(*args, **kwargs)

    monkeypatch.setattr(program, "consume", consume)
    list(engine.stream(ONE_SENTENCE, seed=6))
    full_steps, steps, hold_at = steps, 0, 20
    assert full_steps > 2 * hold_at

    stream = engine.stream(ONE_SENTENCE, seed=6)
    next(stream)  # the first window needs fewer than hold_at steps
    stream.close()  # the worker cannot have passed step hold_at
    release.set()
    wait_until(lambda: engine.stats()["active_rows"] == 0, "the closed stream's row is free")
    assert steps <= hold_at  # the worker stopped at the step in flight (or before the hold)
    with pytest.raises(StopIteration):
        next(stream)

    # Abandoning a for loop with `break` behaves the same once the iterator is closed.
    steps, hold_at = 0, 0
    stream = engine.stream(TEXT, seed=6)
    for _ in stream:
        break
    stream.close()
    wait_until(lambda: engine.stats()["active_rows"] == 0, "the abandoned stream's row is free")
    engine.close()


def test_bad_text_is_rejected_by_stream(codec_lm_engine) -> None:
    with pytest.raises(InputError):
        codec_lm_engine.stream("   ", seed=1)


def test_streaming_benchmark_writes_its_results(tmp_path) -> None:
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_streaming.py"
    spec = importlib.util.spec_from_file_location("bench_streaming", script)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # A smoke test: shorter text and sweeps than the benchmark's own.
    bench.TEXT, bench.FIRST_CHUNK_SWEEP, bench.OVERLAP_SWEEP = TEXT, (4,), (4, 5, 6, 8)
    # The bit-exactness checked below is the causal reference vocoder's (the default voice
    # streams within 30 dB of its one-shot output, see test_default_voice.py).
    from tests.conftest import codec_lm_dir

    args = ["--repeats", "1", "--out", str(tmp_path), "--model", str(codec_lm_dir())]
    assert bench.main(args) == 0
    results = json.loads((tmp_path / "streaming.json").read_text())
    assert (tmp_path / "streaming.png").stat().st_size > 0
    assert results["stream_equals_one_shot_max_abs_difference"] < 1e-5
    for mode in ("one_shot", "stream"):
        assert set(results["modes"][mode]) == {"ttfa_s", "total_s", "rtf"}
    assert {"loadavg_start", "loadavg_end", "cpu_count"} <= set(results["machine"])
    snr = {item["overlap_frames"]: item["snr_db"] for item in results["snr_by_overlap"]}
    assert snr[8] > 100 and 30 <= snr[4] < snr[5] < snr[6]


# -- a failing sink while sentences still decode ---------------------------------------------------


def _cli(args: list[str], **kwargs: Any) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "synth", TEXT, "--stream", *args],
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        **kwargs,
    )


def test_stream_to_dev_full_is_one_clear_error_not_an_abort() -> None:
    """Other sentences were still decoding in the scheduler's worker when the write failed:
    the process aborted at exit (134, "terminate called") after the error line."""
    with open("/dev/full", "wb") as full:
        done = _cli(["-o", "-"], stdout=full)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "onnx-tts: error: cannot write the audio stream: No space left on device"
    ]


def test_stream_to_a_full_disk_is_one_clear_error_and_leaves_no_file(tmp_path) -> None:
    import resource

    def small_files() -> None:  # a full file system, without root: a file size limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "x.wav"
    done = _cli(["-o", str(out)], preexec_fn=small_files)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"onnx-tts: error: cannot write {out}: File too large"), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key", ["first_chunk_frames", "stride_frames"])
def test_window_sizes_are_bounded(codec_lm_engine, key: str) -> None:
    """--first-chunk-frames 100000000 was accepted (every size a user gives has a bound)."""
    with pytest.raises(InputError, match=f"{key} must be at most"):
        codec_lm_engine.stream("Hi.", **{key: 100_000_000})


def test_a_bundle_with_invalid_streaming_defaults_fails_at_load(tmp_path) -> None:
    """streaming.stride_frames 0 loaded and synthesized fine until the first stream."""
    import json
    import shutil

    import onnx_tts
    from tests.conftest import codec_lm_dir

    bundle = tmp_path / "bundle"
    shutil.copytree(codec_lm_dir(), bundle)
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["streaming"]["stride_frames"] = 0
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match=r"streaming defaults.*stride_frames"):
        onnx_tts.load(bundle, cache_dir=None)
