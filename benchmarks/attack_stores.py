"""Round four, category "stores": voice stores trust nothing they read back (issue 36).

A stored voice is tampered with where it lives (the voices directory, or Redis), the way a
disk fault, a hand edit or anyone with write access could: its audio replaced (with or without
its record updated to match), cut, garbled, swapped for a FIFO, a device link or a sparse file;
its record garbled, pointed at another id, unsigned or signed with another secret. Speech with
that voice must then be the promised refusal (404 `voice_damaged` when the record is sound but
the audio is not, 404 `voice_not_found` when the record itself is refused, never its old audio,
never a hang); the voice must leave the list; a control voice uploaded before must still speak
(else: data lost).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import httpx
import numpy as np
import soundfile

from benchmarks.attack_live import (
    CONFIG_STARTERS,
    CORRECT,
    HTTP_CONFIGS,
    SPEECH,
    LiveContext,
    Verdict,
    _stopping,
    add,
    audio_problem,
    envelope_problem,
    register_probes,
    speechlike,
    wav_bytes,
)
from benchmarks.live_server import LiveServer

SECRET = "an-attack-secret-of-32-characters"
OTHER_SECRET = "another-secret-nobody-should-use"
_seeds = iter(range(2000, 100_000))

DAMAGED, NOT_FOUND = "voice_damaged", "voice_not_found"
DISK = {
    "audio_other_same_rate": DAMAGED,
    "audio_other_rate_record_updated": DAMAGED,
    "audio_truncated": DAMAGED,
    "audio_garbage": DAMAGED,
    "audio_empty": DAMAGED,
    "audio_missing": DAMAGED,
    "audio_fifo": DAMAGED,
    "audio_link_dev_zero": DAMAGED,
    "audio_link_other_voice": DAMAGED,
    "audio_hard_link_other_voice": DAMAGED,
    "audio_sparse_6_gib": DAMAGED,
    "audio_directory": DAMAGED,
    "audio_nan": DAMAGED,
    "audio_stereo": DAMAGED,
    "audio_same_samples_as_16_bit": "ok",  # the same content in another encoding: its voice
    "record_garbage": NOT_FOUND,
    "record_other_id": NOT_FOUND,
    "record_missing": NOT_FOUND,
    "record_fifo": NOT_FOUND,
    "record_link_dev_zero": NOT_FOUND,
    "record_huge": NOT_FOUND,
    "record_rate_changed": DAMAGED,
    "record_renamed": "ok",  # without a secret a rename by hand is the operator's right
}
SIGNED_DISK = {
    "legit": "ok",
    "forged_unsigned": NOT_FOUND,
    "forged_other_secret": NOT_FOUND,
    "signed_then_renamed": NOT_FOUND,
    "signed_then_rate_changed": NOT_FOUND,
    "mac_garbage": NOT_FOUND,
    "mac_truncated": NOT_FOUND,
    "mac_of_another_voice": NOT_FOUND,
    "record_of_an_older_server": NOT_FOUND,
    "signed_audio_replaced": DAMAGED,
}
REDIS = {
    "audio_replaced_sha_updated": DAMAGED,
    "audio_replaced_sha_kept": DAMAGED,
    "audio_truncated_sha_updated": DAMAGED,
    "audio_odd_length": DAMAGED,
    "audio_nan_sha_updated": DAMAGED,
    "audio_missing": DAMAGED,
    "audio_wrong_type": DAMAGED,
    "record_garbage": NOT_FOUND,
    "record_other_id": NOT_FOUND,
    "record_no_sha": NOT_FOUND,
    "record_huge": NOT_FOUND,
    "record_rate_changed": DAMAGED,
}
SIGNED_REDIS = {
    "legit": "ok",
    "forged_unsigned": NOT_FOUND,
    "forged_other_secret": NOT_FOUND,
    "signed_then_renamed": NOT_FOUND,
    "mac_of_another_voice": NOT_FOUND,
    "audio_replaced_sha_updated": DAMAGED,
}


# == cases ======================================================================================
def register_cases() -> None:
    """Add this category's cases (attack_round4 calls each module in a fixed order, so
    case ids do not depend on import order)."""
    for config, kinds in (("stores", DISK), ("stores-signed", SIGNED_DISK), ("stores-redis", REDIS),
                          ("stores-redis-signed", SIGNED_REDIS)):  # fmt: skip
        for kind, want in kinds.items():
            expect = "ok" if want == "ok" else "error"
            note = f"{config}: {kind.replace('_', ' ')}"
            add("stores", config, "stored_voice", expect, tamper=kind, code=want,
                seed=next(_seeds), note=note)  # fmt: skip


# == configurations =============================================================================
def _start(ctx: LiveContext, *args: str, redis: bool = False) -> None:
    if redis:
        from tests.redis_server import redis_server

        ctx.redis_url = ctx.stack.enter_context(redis_server(ctx.root / "redis"))
        args = (*args, "--redis", ctx.redis_url, "--cache-dir", "none")
    ctx.servers.append(ctx.stack.enter_context(_stopping(LiveServer(ctx.root, *args))))
    ctx.voice_ids["control"] = _upload(ctx, "control voice", 1999)


STARTERS = {
    "stores": lambda ctx: _start(ctx),
    "stores-signed": lambda ctx: _start(ctx, "--cache-secret", SECRET),
    "stores-redis": lambda ctx: _start(ctx, redis=True),
    "stores-redis-signed": lambda ctx: _start(ctx, "--cache-secret", SECRET, redis=True),
}
CONFIG_STARTERS.update(STARTERS)
HTTP_CONFIGS.update(STARTERS)


def _upload(ctx: LiveContext, name: str, seed: int) -> str:
    clip = wav_bytes(speechlike(2.0, 16000, seed), 16000)
    response = httpx.post(ctx.url + "/v1/audio/voices", files={"audio_sample": ("v.wav", clip)},
                          data={"name": name}, timeout=120)  # fmt: skip
    response.raise_for_status()
    return response.json()["id"]


# == tampering ==================================================================================
def _samples(seed: int) -> np.ndarray:
    return speechlike(2.0, 16000, seed)


def _record(ident: str, name: str, rate: int = 16000, secret: str | None = None, **extra: Any):
    from onnx_tts.server.voices import Voice, voice_meta

    voice = Voice(ident, name, 1, rate)
    return voice_meta(voice, secret.encode() if secret else None, **extra)


SWAPPED = ("audio_fifo", "audio_link_dev_zero", "audio_link_other_voice",
           "audio_hard_link_other_voice", "audio_sparse_6_gib", "audio_directory")  # fmt: skip


def tamper_disk(ctx: LiveContext, kind: str, seed: int) -> str:
    """The id of a voice in the voices directory, tampered with as `kind` says."""
    from onnx_tts.server.voices import voice_id

    voices = ctx.root / "voices"
    forged = kind.startswith(("forged", "record_of_an_older"))
    if forged:
        samples = _samples(seed)
        ident = voice_id(samples, 16000)
        secret = OTHER_SECRET if kind == "forged_other_secret" else None
        record = _record(ident, f"forged {seed}", secret=secret)
        if kind == "record_of_an_older_server":
            record.pop("mac", None)
        soundfile.write(str(voices / f"{ident}.wav"), samples, 16000, subtype="FLOAT")
        (voices / f"{ident}.json").write_text(json.dumps(record))
        return ident
    ident = _upload(ctx, f"victim {seed}", seed)
    if kind == "legit":
        return ident
    audio, meta = voices / f"{ident}.wav", voices / f"{ident}.json"
    record = json.loads(meta.read_text())
    other = _samples(seed + 50_000)
    if kind in ("audio_other_same_rate", "signed_audio_replaced"):
        soundfile.write(str(audio), other, 16000, subtype="FLOAT")
    elif kind == "audio_other_rate_record_updated":
        soundfile.write(str(audio), speechlike(2.0, 24000, seed), 24000, subtype="FLOAT")
        record["sample_rate"] = 24000
        meta.write_text(json.dumps(record))
    elif kind == "audio_truncated":
        data = audio.read_bytes()
        audio.write_bytes(data[: len(data) // 2])
    elif kind == "audio_garbage":
        audio.write_bytes(os.urandom(64_000))
    elif kind == "audio_empty":
        audio.write_bytes(b"")
    elif kind == "audio_missing":
        audio.unlink()
    elif kind in SWAPPED:
        audio.unlink()
        control = voices / f"{ctx.voice_ids['control']}.wav"
        if kind == "audio_fifo":
            os.mkfifo(audio)
        elif kind == "audio_link_dev_zero":
            audio.symlink_to("/dev/zero")
        elif kind == "audio_link_other_voice":
            audio.symlink_to(control)
        elif kind == "audio_hard_link_other_voice":
            os.link(control, audio)
        elif kind == "audio_sparse_6_gib":
            with open(audio, "wb") as handle:
                handle.truncate(6 << 30)
        else:
            audio.mkdir()
    elif kind == "audio_nan":
        bad = _samples(seed).copy()
        bad[100] = np.nan
        soundfile.write(str(audio), bad, 16000, subtype="FLOAT")
    elif kind == "audio_stereo":
        soundfile.write(str(audio), np.stack([_samples(seed)] * 2, axis=1), 16000, subtype="FLOAT")
    elif kind == "audio_same_samples_as_16_bit":
        # Uploads are 16-bit clips: the stored floats are exact 16-bit values.
        samples, _ = soundfile.read(str(audio), dtype="float32")
        soundfile.write(str(audio), samples, 16000, subtype="PCM_16")
    elif kind == "record_garbage":
        meta.write_bytes(os.urandom(300))
    elif kind == "record_other_id":
        meta.write_text(json.dumps({**record, "id": ctx.voice_ids["control"]}))
    elif kind == "record_missing":
        meta.unlink()
    elif kind in ("record_fifo", "record_link_dev_zero"):
        meta.unlink()
        os.mkfifo(meta) if kind == "record_fifo" else meta.symlink_to("/dev/zero")
    elif kind == "record_huge":
        meta.write_text(json.dumps({**record, "padding": "x" * 10_000}))
    elif kind in ("record_rate_changed", "signed_then_rate_changed"):
        meta.write_text(json.dumps({**record, "sample_rate": 24000}))
    elif kind in ("record_renamed", "signed_then_renamed"):
        meta.write_text(json.dumps({**record, "name": f"renamed {seed}"}))
    elif kind == "mac_garbage":
        meta.write_text(json.dumps({**record, "mac": "zz" * 32}))
    elif kind == "mac_truncated":
        meta.write_text(json.dumps({**record, "mac": record["mac"][:32]}))
    elif kind == "mac_of_another_voice":
        control = json.loads((voices / f"{ctx.voice_ids['control']}.json").read_text())
        meta.write_text(json.dumps({**record, "mac": control["mac"]}))
    else:
        raise KeyError(kind)
    return ident


def tamper_redis(ctx: LiveContext, kind: str, seed: int) -> str:
    import redis

    from onnx_tts.server.voices import voice_id

    client = redis.Redis.from_url(ctx.redis_url)
    meta_key, prefix = "onnx-tts:voices:meta", "onnx-tts:voices:audio:"
    try:
        if kind.startswith("forged"):
            samples = _samples(seed)
            ident = voice_id(samples, 16000)
            data = np.ascontiguousarray(samples, "<f4").tobytes()
            secret = OTHER_SECRET if kind == "forged_other_secret" else None
            record = _record(ident, f"forged {seed}", secret=secret,
                             sha256=hashlib.sha256(data).hexdigest())  # fmt: skip
            client.hset(meta_key, ident, json.dumps(record))
            client.set(prefix + ident, data)
            return ident
        ident = _upload(ctx, f"victim {seed}", seed)
        if kind == "legit":
            return ident
        record = json.loads(client.hget(meta_key, ident))
        other = np.ascontiguousarray(_samples(seed + 50_000), "<f4").tobytes()
        if kind.startswith("audio_replaced") or kind in ("audio_truncated_sha_updated",
                                                         "audio_nan_sha_updated"):  # fmt: skip
            data = other
            if kind == "audio_truncated_sha_updated":
                data = client.get(prefix + ident)[:16_000]
            elif kind == "audio_nan_sha_updated":
                values = np.frombuffer(client.get(prefix + ident), "<f4").copy()
                values[10] = np.nan
                data = values.tobytes()
            client.set(prefix + ident, data)
            if kind != "audio_replaced_sha_kept":
                record["sha256"] = hashlib.sha256(data).hexdigest()
                client.hset(meta_key, ident, json.dumps(record))
        elif kind == "audio_odd_length":
            client.set(prefix + ident, client.get(prefix + ident) + b"\x01")
        elif kind == "audio_missing":
            client.delete(prefix + ident)
        elif kind == "audio_wrong_type":
            client.delete(prefix + ident)
            client.hset(prefix + ident, "a", "b")
        elif kind == "record_garbage":
            client.hset(meta_key, ident, os.urandom(300))
        elif kind == "record_other_id":
            client.hset(meta_key, ident, json.dumps({**record, "id": ctx.voice_ids["control"]}))
        elif kind == "record_no_sha":
            record.pop("sha256")
            client.hset(meta_key, ident, json.dumps(record))
        elif kind == "record_huge":
            client.hset(meta_key, ident, json.dumps({**record, "padding": "x" * 10_000}))
        elif kind == "record_rate_changed":
            client.hset(meta_key, ident, json.dumps({**record, "sample_rate": 24000}))
        elif kind == "signed_then_renamed":
            client.hset(meta_key, ident, json.dumps({**record, "name": f"renamed {seed}"}))
        elif kind == "mac_of_another_voice":
            control = json.loads(client.hget(meta_key, ctx.voice_ids["control"]))
            client.hset(meta_key, ident, json.dumps({**record, "mac": control["mac"]}))
        else:
            raise KeyError(kind)
        return ident
    finally:
        client.close()


# == the probe ==================================================================================
def _speak(ctx: LiveContext, voice: str) -> httpx.Response:
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm", "seed": 2}
    return httpx.post(ctx.url + SPEECH, json=body, timeout=180)


def probe_stored_voice(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    tamper = tamper_redis if ctx.redis_url else tamper_disk
    ident = tamper(ctx, case["tamper"], case["seed"])
    response = _speak(ctx, ident)
    listed = httpx.get(ctx.url + "/v1/audio/voices", timeout=60)
    control = _speak(ctx, ctx.voice_ids["control"])
    if control.status_code != 200 or audio_problem(control.content, "pcm"):
        return Verdict("data lost", f"the control voice no longer speaks: {control.status_code}")
    if listed.status_code != 200:
        return Verdict("traceback" if listed.status_code >= 500 else "silently wrong",
                       f"the list answered {listed.status_code}")  # fmt: skip
    ids = {v["id"] for v in listed.json()["voices"]}
    if case["code"] == "ok":
        if response.status_code != 200:
            return Verdict("silently wrong", f"{response.status_code}: {response.text[:100]}")
        problem = audio_problem(response.content, "pcm")
        return Verdict("silently wrong", problem) if problem else CORRECT
    if response.status_code == 200:
        return Verdict("silently wrong", "the tampered voice spoke under its id")
    if response.status_code >= 500:
        return Verdict("traceback", f"{response.status_code}: {response.text[:120]}")
    problem = envelope_problem(response.content)
    if problem:
        return Verdict("silently wrong", problem)
    error = response.json()["error"]
    if (response.status_code, error.get("code"), error.get("param")) != (404, case["code"],
                                                                          "voice"):  # fmt: skip
        return Verdict("silently wrong", f"{response.status_code} {error.get('code')}, want "
                       f"404 {case['code']}")  # fmt: skip
    if ident in ids:
        return Verdict("silently wrong", "refused, yet still listed")
    return Verdict("clear error")


register_probes(globals())
