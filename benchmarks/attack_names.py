"""Round four, category "names": a voice name must reach exactly one voice (issue 36).

Uploads named like a voice that already answers to that name (the default voice, OpenAI's
names, a model's builtin voices, an id, another stored voice), in any case, spacing, Unicode
form or with invisible characters, must be refused (409 in OpenAI's envelope, param "name");
speech with any spelling of a name must use exactly the voice it denotes (byte-equal to the
same request by id: the default voice and the MOSS stand-in decode greedily), over HTTP and
Wyoming; a name two stored voices answer to (a store written by something else) is refused,
never resolved to one of them.
"""

from __future__ import annotations

import json
import socket
import unicodedata
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile

from benchmarks.attack_live import (
    CONFIG_STARTERS,
    CORRECT,
    HTTP_CONFIGS,
    REPO,
    SNAPSHOT_CONFIGS,
    SPEECH,
    LiveContext,
    Verdict,
    _read_until_type,
    _stopping,
    add,
    envelope_problem,
    register_probes,
    speechlike,
    wav_bytes,
    wy_event,
)
from benchmarks.live_server import LiveServer, LiveWyoming

VOICE_MODEL = REPO / "onnx_tts" / "models" / "voice"
OPENAI = "alloy ash ballad coral echo fable nova onyx sage shimmer verse marin cedar".split()
STORED = {"Kitchen Light": 61, "Café Noir": 62}  # uploaded when the configuration starts
MOSS = {"max_new_frames": 6, "sample_mode": "greedy"}
_seeds = iter(range(1000, 100_000))


def fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def upload_case(name: str, status: int, code: str, note: str, config: str = "names") -> None:
    add("names", config, "name_upload", "error", name=name, status=status, code=code,
        seed=next(_seeds), note=note)  # fmt: skip


# A store written by something else (an older server, a hand edit): legacy voices one name
# reaches, a legacy voice named like OpenAI's voice, one named like another voice's id.
# (key, stored name, seed); "<id:KEY>" in a name is that voice's id.
LEGACY = [("porch-a", "Porch", 71), ("porch-b", "porch ", 72), ("shimmer", "Shimmer", 73),
          ("id-named", "<id:porch-a>", 74)]  # fmt: skip


# == cases ======================================================================================
def register_cases() -> None:
    """Add this category's cases (attack_round4 calls each module in a fixed order, so
    case ids do not depend on import order)."""
    for base in ["default", *OPENAI]:
        spellings = ((base, "as is"), (base.upper(), "upper case"),
                     (base + " ", "a trailing space"), (fullwidth(base), "fullwidth"))  # fmt: skip
        for spelled, how in spellings:
            upload_case(spelled, 409, "voice_name_reserved", f"upload named {base!r}, {how}")
    for spelled, how in [
        ("no\u200bva", "a zero-width space inside"),
        ("\u2060alloy", "a word joiner in front"),
        ("al\u00adloy", "a soft hyphen inside"),
        ("alloy\u200d", "a zero-width joiner after"),
        ("\ufeffecho", "a byte order mark in front"),
        ("sh\u200cimmer", "a zero-width non-joiner inside"),
        ("\u00a0nova", "a no-break space in front"),
        ("nova\u3000", "an ideographic space after"),
    ]:
        upload_case(spelled, 409, "voice_name_reserved", f"OpenAI's name with {how}")
    for spelled, how in [
        ("voice_0123456789abcdef01234567", "shaped like an id"),
        ("VOICE_0123456789ABCDEF01234567", "shaped like an id, upper case"),
        ("<id:Kitchen Light>", "another stored voice's id"),
        (" <id:Café Noir>", "another stored voice's id after a space"),
    ]:
        upload_case(spelled, 409, "voice_name_reserved", f"upload {how}")
    for spelled in ("Junhao", "junhao", " AVA", fullwidth("bella"), "BELLA "):
        upload_case(
            spelled, 409, "voice_name_reserved", f"MOSS-TTS-Nano's builtin voice as {spelled!r}"
        )
    for spelled in (
        "kitchen light",
        "KITCHEN LIGHT",
        " Kitchen  Light ",
        "Kitchen\u00a0Light",
        fullwidth("kitchen") + " " + fullwidth("light"),
        "café noir",
        unicodedata.normalize("NFD", "Café Noir"),
        "CAFÉ NOIR",
        "Cafe\u0301 Noir",
    ):
        upload_case(
            spelled, 409, "voice_name_taken", f"another clip named {spelled!r} (a stored name)"
        )
    for spelled in ("\u200b", "\u200b\u200d", "\u00ad\u2060"):
        upload_case(spelled, 400, "invalid_value", f"a name of invisible characters {spelled!r}")

    for spelled, ref in [
        ("kitchen light", "<id:Kitchen Light>"),
        (" KITCHEN LIGHT", "<id:Kitchen Light>"),
        ("Kitchen\u00a0Light", "<id:Kitchen Light>"),
        (fullwidth("kitchen") + " " + fullwidth("light"), "<id:Kitchen Light>"),
        ({"id": "kitchen light"}, "<id:Kitchen Light>"),
        (unicodedata.normalize("NFD", "café noir"), "<id:Café Noir>"),
        ("CAFÉ NOIR", "<id:Café Noir>"),
        ("alloy", "default"),
        ("ALLOY", "default"),
        ("nova ", "default"),
        (fullwidth("shimmer"), "default"),
        ("Default", "default"),
        ("no\u200bva", "default"),
        ({"id": "echo"}, "default"),
    ]:
        add("names", "names", "name_speech", "ok", voice=spelled, same_as=ref,
            note=f"speech with {spelled!r} is exactly {ref!r}")  # fmt: skip
    for spelled, ref in (("  ava", "Ava"), ("BELLA", "Bella"), ("junhao", "Junhao")):
        add("names", "names", "name_speech", "ok", voice=spelled, same_as=ref, model="moss",
            note=f"MOSS speech with {spelled!r} is exactly its builtin {ref!r}")  # fmt: skip
    for spelled, model, why in [
        ("nobody", None, "an unknown name"),
        ("Junhao", None, "MOSS's builtin voice asked of the other model"),
        ("voice_000000000000000000000000", None, "an id no voice has"),
        ("Kitchen Ligh", None, "a name one letter short"),
    ]:
        add("names", "names", "name_speech", "error", voice=spelled, model=model, status=404,
            code="voice_not_found", note=why)  # fmt: skip
    for spelled, ref in [
        ("<id:Kitchen Light>", "<id:Kitchen Light>"),
        ("kitchen light", "<id:Kitchen Light>"),
        (" KITCHEN  LIGHT", "<id:Kitchen Light>"),
        ("alloy", "default"),
        ("ｃａｆé noir", "<id:Café Noir>"),
    ]:
        add("names", "names", "wy_name", "ok", voice=spelled, same_as=ref,
            note=f"Wyoming synthesize with {spelled!r} is exactly {ref!r}")  # fmt: skip
    add("names", "names", "wy_name", "error", voice="nobody", code="voice_not_found",
        note="Wyoming: an unknown name")  # fmt: skip

    for spelled in ("porch", "PORCH", "shimmer", "Shimmer", "<id:porch-a>"):
        add("names", "names-legacy", "name_speech", "error", voice=spelled, status=409,
            code="voice_ambiguous", note=f"legacy: {spelled!r} reaches two voices")  # fmt: skip
    for key in ("porch-b", "shimmer", "id-named"):
        add("names", "names-legacy", "name_speech", "ok", voice=f"<id:{key}>",
            same_as=f"<id:{key}>", note=f"legacy store: the voice {key!r} by its id")  # fmt: skip
    add("names", "names-legacy", "name_speech", "ok", voice="alloy", same_as="default",
        note="legacy store: 'alloy' (no legacy voice takes it) is the default voice")  # fmt: skip
    add("names", "names-legacy", "wy_name", "error", voice="porch", code="voice_ambiguous",
        note="Wyoming, legacy store: 'porch' reaches two voices")  # fmt: skip


# == configurations =============================================================================
def _upload(url: str, name: str, seed: int) -> httpx.Response:
    clip = wav_bytes(speechlike(2.0, 16000, seed), 16000)
    return httpx.post(url + "/v1/audio/voices", files={"audio_sample": ("v.wav", clip)},
                      data={"name": name}, timeout=120)  # fmt: skip


def start_names(ctx: LiveContext) -> None:
    from export.moss_tts_nano import build, small

    moss = build(ctx.root / "moss", small())
    server = LiveServer(ctx.root, "--model", str(VOICE_MODEL), "--model", str(moss),
                        "--threads", "1")  # fmt: skip
    ctx.servers.append(ctx.stack.enter_context(_stopping(server)))
    models = [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]
    ctx.voice_ids["model:moss"] = next(m for m in models if "moss" in m.lower())
    for name, seed in STORED.items():
        response = _upload(server.url, name, seed)
        response.raise_for_status()
        ctx.voice_ids[name] = response.json()["id"]
    _start_wyoming(ctx)


def legacy_voice(voices: Path, name: str, seed: int) -> str:
    """A voice written as an older server (or a hand edit) would: no name checks."""
    from onnx_tts.server.voices import Voice, voice_id

    samples = speechlike(2.0, 16000, seed)
    voice = Voice(voice_id(samples, 16000), name, 1, 16000)
    soundfile.write(str(voices / f"{voice.id}.wav"), samples, 16000, subtype="FLOAT")
    (voices / f"{voice.id}.json").write_text(json.dumps(voice.__dict__))
    return voice.id


def start_names_legacy(ctx: LiveContext) -> None:
    voices = ctx.root / "voices"
    voices.mkdir(parents=True)
    for key, name, seed in LEGACY:
        ctx.voice_ids[key] = legacy_voice(voices, resolve(ctx, name), seed)
    server = LiveServer(ctx.root)
    ctx.servers.append(ctx.stack.enter_context(_stopping(server)))
    _start_wyoming(ctx)


def _start_wyoming(ctx: LiveContext) -> None:
    """A Wyoming server on the same voices (kept apart from ctx.servers, which are HTTP)."""
    wyoming = LiveWyoming(ctx.root / "wyoming", "--voices-dir", str(ctx.root / "voices"))
    ctx.stack.enter_context(_stopping(wyoming))
    ctx.stack_state["wyoming"] = wyoming  # type: ignore[attr-defined]


CONFIG_STARTERS.update({"names": start_names, "names-legacy": start_names_legacy})
HTTP_CONFIGS.update({"names", "names-legacy"})
SNAPSHOT_CONFIGS.update({"names", "names-legacy"})


# == probes =====================================================================================
def resolve(ctx: LiveContext, value: Any) -> Any:
    """A case's voice with `<id:NAME>` placeholders replaced by the stored voice's id."""
    if isinstance(value, dict):
        return {k: resolve(ctx, v) for k, v in value.items()}
    if isinstance(value, str) and "<id:" in value:
        start = value.index("<id:")
        end = value.index(">", start)
        return value[:start] + ctx.voice_ids[value[start + 4 : end]] + value[end + 1 :]
    return value


def refusal(response: httpx.Response, case: dict[str, Any], param: str) -> Verdict:
    """The promised refusal: `status`, OpenAI's envelope, `param` and `code`."""
    if response.status_code >= 500:
        return Verdict("traceback", f"{response.status_code}: {response.text[:120]}")
    if response.status_code < 400:
        return Verdict("silently wrong", f"{response.status_code} where {case['status']} was due")
    problem = envelope_problem(response.content)
    if problem:
        return Verdict("silently wrong", problem)
    error = response.json()["error"]
    got = (response.status_code, error.get("param"), error.get("code"))
    if got != (case["status"], param, case["code"]):
        return Verdict("silently wrong", f"got {got}, want {(case['status'], param, case['code'])}")
    return Verdict("clear error")


def probe_name_upload(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    name = resolve(ctx, case["name"])
    response = _upload(ctx.url, name, case["seed"])
    verdict = refusal(response, case, "name")
    if verdict.outcome != "clear error":
        return verdict
    stored = httpx.get(ctx.url + "/v1/audio/voices", timeout=30).json()["voices"]
    if any(v.get("name") == " ".join(name.split()) and v["id"].startswith("voice_") and
           v["id"] not in ctx.voice_ids.values() for v in stored):  # fmt: skip
        return Verdict("silently wrong", "refused, yet listed")
    return verdict


def _speech(ctx: LiveContext, voice: Any, model: str | None) -> httpx.Response:
    body: dict[str, Any] = {"input": "Hello there.", "voice": voice, "response_format": "pcm",
                            "seed": 5}  # fmt: skip
    if model == "moss":
        body.update(model=ctx.voice_ids["model:moss"], **MOSS)
    return httpx.post(ctx.url + SPEECH, json=body, timeout=180)


def probe_name_speech(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    response = _speech(ctx, resolve(ctx, case["voice"]), case.get("model"))
    if case["expect"] == "error":
        return refusal(response, case, "voice")
    if response.status_code != 200:
        return Verdict("silently wrong" if response.status_code < 500 else "traceback",
                       f"{response.status_code}: {response.text[:120]}")  # fmt: skip
    reference = _speech(ctx, resolve(ctx, case["same_as"]), case.get("model"))
    if reference.status_code != 200 or reference.content != response.content:
        return Verdict("silently wrong", f"not the voice {case['same_as']!r} denotes")
    others = [_speech(ctx, v, case.get("model")).content for v in _other_voices(ctx, case)]
    if any(response.content == other for other in others):
        return Verdict("silently wrong", "the same audio as another voice: names do not matter")
    return CORRECT


def _other_voices(ctx: LiveContext, case: dict[str, Any]) -> list[str]:
    """A voice other than the reference, to show the comparison can fail."""
    if case.get("model") == "moss":
        return ["Bella" if case["same_as"] == "Ava" else "Ava"]
    same = resolve(ctx, case["same_as"])
    ids = [i for k, i in ctx.voice_ids.items() if not k.startswith("model:") and i != same]
    return ["default"] if same != "default" else ids[:1]


def _wy_speak(ctx: LiveContext, voice: str) -> tuple[bytes, str]:
    """(pcm, error code) of one Wyoming synthesize with `voice`."""
    wyoming = ctx.stack_state["wyoming"]  # type: ignore[attr-defined]
    with socket.create_connection(("127.0.0.1", wyoming.port), timeout=60) as sock:
        sock.sendall(wy_event("synthesize", {"text": "Hello there.", "voice": {"name": voice}}))
        events, found = _read_until_type(sock, ("audio-stop", "error"), 180)
    errors = [e for e in events if e["type"] == "error"]
    if errors:
        return b"", str(errors[0]["data"].get("code"))
    if not found:
        return b"", "<no answer>"
    return b"".join(e["payload"] for e in events if e["type"] == "audio-chunk"), ""


def probe_wy_name(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    wyoming = ctx.stack_state["wyoming"]  # type: ignore[attr-defined]
    mark = len(wyoming.log())
    pcm, code = _wy_speak(ctx, resolve(ctx, case["voice"]))
    if "Traceback" in wyoming.log()[mark:]:
        return Verdict("traceback", "Traceback in the Wyoming log")
    if code == "<no answer>":
        return Verdict("runaway", "no audio-stop and no error")
    if case["expect"] == "error":
        if not code:
            return Verdict("silently wrong", "audio where an error was due")
        if code != case["code"]:
            return Verdict("silently wrong", f"error code {code}, want {case['code']}")
        return Verdict("clear error")
    if code:
        return Verdict("silently wrong", f"error {code}")
    reference, _ = _wy_speak(ctx, resolve(ctx, case["same_as"]))
    if not pcm or pcm != reference:
        return Verdict("silently wrong", f"not the voice {case['same_as']!r} denotes")
    other = _other_voices(ctx, case)[0]
    if _wy_speak(ctx, other)[0] == pcm:
        return Verdict("silently wrong", "the same audio as another voice")
    if np.frombuffer(pcm, "<i2").size < 1000:
        return Verdict("silently wrong", "short audio")
    return CORRECT


register_probes(globals())
