"""The files of a MOSS-TTS-Nano layout, for the offline tools: its two directories (the TTS
model and the codec, side by side in an output), every graph by role (codec graphs prefixed
`codec_`), and the external-data files the metas name: graphs that share one (prefill and
decode_step, the local graphs, the codec decoders) keep sharing it, so the metas stay valid and
each weight is stored once. decode_step is the step LM that `convert --inplace-kv` rewrites."""

from __future__ import annotations

from onnx_tts.families.base import Detection
from onnx_tts.families.files import Check, GraphFile, Hint, ModelFiles, Runs
from onnx_tts.families.moss_tts_nano.layout import MossLayout

CODEC_PREFIX = "codec_"
STEP_LM = "decode_step"
CODEC_STEP_FRAMES = 4  # frames per codec decode_step check call (the streaming window)
CODEC_FULL_FRAMES = 12
FRAME_CHECKED = ("should_continue",)  # the frame graphs' outputs quantize compares


def _runs(role: str) -> Runs:
    if role == f"{CODEC_PREFIX}encode":
        return "voice"  # reference audio -> prompt codes, cached per voice
    if role.startswith(CODEC_PREFIX) or role == "prefill":
        return "call"
    return "step"  # the global decode step and the local depth graphs, every frame


def _checks(layout: MossLayout) -> dict[str, Check]:
    c = layout.config
    ids = {"input_ids": Hint(high=c.codebook + 1)}  # valid in the text and code columns
    local = {
        "text_token_id": Hint(high=c.vocab),
        "audio_token_id": Hint(high=c.codebook),
        "audio_prefix_token_ids": Hint(high=c.codebook + 1),
        "channel_index": Hint(high=c.n_vq),
        "step_type": Hint(high=3),
        "repetition_seen_mask": Hint(high=2),
        # The frame graphs sample; with u = 0 they take the likeliest candidate (a random u
        # would compare draws, which a tiny logit change moves where the distribution is
        # flat).
        "assistant_random_u": Hint(value=0.0),
        "audio_random_u": Hint(value=0.0),
        "repetition_penalty": Hint(value=1.2),
    }
    state = {s.input: Hint(value=float(s.fill), shape=s.shape) for s in layout.state}

    def codec(frames: int) -> dict[str, Hint]:
        return {
            "audio_codes": Hint(high=c.codebook, shape=(1, frames, c.n_vq)),
            "audio_code_lengths": Hint(length_of=("audio_codes", 1)),
        }

    return {
        STEP_LM: Check("cache", ("prefill", STEP_LM), ids),
        "local_cached_step": Check("cache", ("local_cached_step",), local),
        "local_decoder": Check("calls", ("local_decoder",), local),
        # A frame graph's 16 codes chain: each channel's choice is the next one's input, so
        # one flipped choice changes every later code. Where the logits are flat (random
        # weights) the codes then agree at ~0.79 while every logit agrees at cosine 0.9999
        # and 0.97-0.99 of the choices taken one by one. Its choices are judged one by one
        # through the graphs beside it, which run the same shared weights and take each
        # channel's input as given (local_decoder, local_cached_step: logits); the frame
        # graph itself by its continue decision.
        "local_fixed_sampled_frame": Check(
            "calls", ("local_fixed_sampled_frame",), local, outputs=FRAME_CHECKED
        ),
        "local_greedy_frame": Check("calls", ("local_greedy_frame",), local, outputs=FRAME_CHECKED),
        "codec_decode_full": Check("calls", ("codec_decode_full",), codec(CODEC_FULL_FRAMES)),
        # From the initial state: the audio is the result (the state outputs are cache
        # slots, mostly empty after one window).
        "codec_decode_step": Check(
            "calls",
            ("codec_decode_step",),
            {**codec(CODEC_STEP_FRAMES), **state},
            outputs=("audio", "audio_lengths"),
        ),
    }


def model_files(detection: Detection) -> ModelFiles:
    """The files of the layout `detection` read."""
    layout: MossLayout = detection.inspected
    specs = {
        **layout.tts_graphs,
        **{f"{CODEC_PREFIX}{role}": g for role, g in layout.codec_graphs.items()},
    }
    checks = _checks(layout)
    graphs = tuple(
        GraphFile(
            role,
            f"{spec.path.parent.name}/{spec.path.name}",
            runs=_runs(role),
            step_lm=role == STEP_LM,
            data=layout.external_data.get(spec.path.name, ()),
            check=checks.get(role),
        )
        for role, spec in specs.items()
    )
    directories = {d.name: d for d in (layout.tts_dir, layout.codec_dir)}
    return ModelFiles(detection.root, directories, graphs)


__all__ = ["model_files"]
