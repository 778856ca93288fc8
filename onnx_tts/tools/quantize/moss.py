"""Quantizing a MOSS-TTS-Nano layout (the parent of its two directories): graphs keep their
file names and their shared external-data files (`moss_tts_global_shared.data` for prefill +
decode_step, `moss_tts_local_shared.data` for the local graphs, the codec decoders'
`moss_audio_tokenizer_decode_shared.data`), so the metas stay valid and weights that two
graphs share are stored once. Graphs that share a data file are quantized, checked and kept
together. A decode_step converted for the in-place cache (`convert --inplace-kv`) stays so."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import onnx

from onnx_tts.errors import ModelError
from onnx_tts.families.moss_tts_nano.layout import MossLayout
from onnx_tts.families.moss_tts_nano.reader import inspect_layout
from onnx_tts.tools.bundle_files import save_sharing_data
from onnx_tts.tools.quantize.feeds import Hint
from onnx_tts.tools.quantize.plan import Check, GraphJob, GraphResult
from onnx_tts.tools.quantize.weights import WeightsSpec

ENCODER_NOTE = "runs once per reference voice (its codes are cached), not on the decode path"
CODEC_STEP_FRAMES = 4  # frames per codec decode_step check call (the streaming window)
CODEC_FULL_FRAMES = 12


class MossTarget:
    """A MOSS-TTS-Nano layout."""

    family = "moss-tts-nano"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.layout: MossLayout = inspect_layout(self.root)
        self.files: dict[str, Path] = {
            **{role: g.path for role, g in self.layout.tts_graphs.items()},
            **{f"codec_{role}": g.path for role, g in self.layout.codec_graphs.items()},
        }
        for role, path in self.files.items():
            if len(self.layout.external_data.get(path.name, ())) > 1:
                raise ModelError(f"{path.name} ({role}) keeps its weights in several data files")

    def _data_file(self, role: str) -> str:
        path = self.files[role]
        names = self.layout.external_data.get(path.name, ())
        return f"{path.parent.name}/{names[0]}" if names else f"{path.parent.name}/{path.name}"

    def _checks(self) -> dict[str, Check]:
        c = self.layout.config
        ids = {"input_ids": Hint(high=c.codebook + 1)}  # valid in the text and code columns
        local = {
            "text_token_id": Hint(high=c.vocab),
            "audio_token_id": Hint(high=c.codebook),
            "audio_prefix_token_ids": Hint(high=c.codebook + 1),
            "channel_index": Hint(high=c.n_vq),
            "step_type": Hint(high=3),
            "repetition_seen_mask": Hint(high=2),
            # The frame graphs sample; with u = 0 they take the likeliest candidate, so equal
            # codes mean the same top choice channel after channel (a random u would compare
            # draws, which a tiny logit change moves where the distribution is flat).
            "assistant_random_u": Hint(value=0.0),
            "audio_random_u": Hint(value=0.0),
            "repetition_penalty": Hint(value=1.2),
        }
        state = {s.input: Hint(value=float(s.fill), shape=s.shape) for s in self.layout.state}

        def codec(frames: int) -> dict[str, Hint]:
            return {
                "audio_codes": Hint(high=c.codebook, shape=(1, frames, c.n_vq)),
                "audio_code_lengths": Hint(length_of=("audio_codes", 1)),
            }

        return {
            "decode_step": Check("cache", ("prefill", "decode_step"), ids),
            "local_cached_step": Check("cache", ("local_cached_step",), local),
            "local_decoder": Check("calls", ("local_decoder",), local),
            "local_fixed_sampled_frame": Check("calls", ("local_fixed_sampled_frame",), local),
            "local_greedy_frame": Check("calls", ("local_greedy_frame",), local),
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

    def jobs(self) -> list[GraphJob]:
        groups: dict[str, list[str]] = {}
        for role in self.files:
            groups.setdefault(self._data_file(role), []).append(role)
        checks = self._checks()
        jobs = []
        for data, roles in groups.items():
            name = Path(data).name.removesuffix(".data").removesuffix(".onnx")
            sources = tuple(self.files[role] for role in roles)
            if "codec_encode" in roles:
                jobs.append(GraphJob(name, tuple(roles), sources, note=ENCODER_NOTE))
                continue
            found = tuple(checks[role] for role in roles if role in checks)
            per_step = not any(role.startswith("codec_") for role in roles)
            jobs.append(GraphJob(name, tuple(roles), sources, found, per_step=per_step))
        return jobs

    def settle(self, results: Sequence[GraphResult]) -> None:
        """Every result stands as decided."""

    def write(self, out: Path, results: Sequence[GraphResult], spec: WeightsSpec) -> None:
        rewritten = {r.job.name: r for r in results if r.kept}
        data_files = {
            Path(self._data_file(role)).name
            for result in rewritten.values()
            for role in result.job.roles
        }
        directories = dict.fromkeys((self.layout.tts_dir, self.layout.codec_dir))
        for directory in directories:
            shutil.copytree(
                directory,
                out / directory.name,
                ignore=lambda _, names: [n for n in names if n in data_files],
            )
        for result in rewritten.values():
            job = result.job
            data = Path(self._data_file(job.roles[0])).name
            graphs = []
            for role, source in zip(job.roles, job.sources, strict=True):
                model = onnx.load(str(result.candidates[role]), load_external_data=True)
                graphs.append((out / source.parent.name / source.name, model))
            save_sharing_data(graphs, data)


__all__ = ["MossTarget"]
