// onnx-tts web page: plain JS, no libraries. Speech is requested as raw 16-bit PCM
// (stream_format "audio"), played through Web Audio as the chunks arrive, and kept so that
// it can be downloaded when it ends: as WAV or raw PCM from what was kept, in the other
// formats (mp3, flac, opus) asked of the server again with the same seed, so the file holds
// the speech that was heard (the server's result cache answers the repeat).
"use strict";

const $ = (id) => document.getElementById(id);
let current = null; // {controller, context} of the speech in progress
let spoken = null; // {body, kept, rate} of the last finished speech, for its download
const EXTENSIONS = { wav: "wav", mp3: "mp3", flac: "flac", opus: "opus", pcm: "pcm" };

function headers(extra = {}) {
  const key = $("api-key").value.trim();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function say(element, text, isError = false) {
  element.textContent = text;
  element.classList.toggle("error", isError);
}

async function errorText(response) {
  try {
    const body = await response.json();
    return body.error && body.error.message ? body.error.message : response.statusText;
  } catch (_) {
    return `${response.status} ${response.statusText}`;
  }
}

async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (!response.ok) throw new Error(await errorText(response));
  const models = (await response.json()).data.filter((m) => !m.alias_of);
  $("model").replaceChildren(...models.map((m) => new Option(m.id, m.id)));
}

async function loadVoices(select) {
  const response = await fetch("/v1/audio/voices", { headers: headers() });
  if (!response.ok) throw new Error(await errorText(response));
  const voices = (await response.json()).voices;
  $("voice").replaceChildren(...voices.map((v) => new Option(v.name, v.id)));
  if (select) $("voice").value = select;
}

function wavFile(chunks, rate) {
  const length = chunks.reduce((n, c) => n + c.byteLength, 0);
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, s) => [...s].forEach((ch, i) => header.setUint8(offset + i, ch.charCodeAt(0)));
  text(0, "RIFF"); header.setUint32(4, 36 + length, true); text(8, "WAVE");
  text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true);
  header.setUint16(22, 1, true); header.setUint32(24, rate, true);
  header.setUint32(28, rate * 2, true); header.setUint16(32, 2, true); header.setUint16(34, 16, true);
  text(36, "data"); header.setUint32(40, length, true);
  return new Blob([header, ...chunks], { type: "audio/wav" });
}

function disableDownload() {
  const download = $("download");
  download.classList.add("disabled");
  download.setAttribute("aria-disabled", "true");
}

// The last speech as a file in the chosen format: made here for wav and pcm, asked of the
// server for the others.
async function prepareDownload() {
  if (!spoken) return;
  const format = $("format").value;
  const download = $("download");
  const label = $("format").selectedOptions[0].textContent.split(" ")[0];
  disableDownload();
  download.textContent = `Download ${label}`;
  let blob;
  if (format === "wav") {
    blob = wavFile(spoken.kept, spoken.rate);
  } else if (format === "pcm") {
    blob = new Blob(spoken.kept, { type: "audio/pcm" });
  } else {
    download.textContent = `Preparing ${label}...`;
    const response = await fetch("/v1/audio/speech", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ ...spoken.body, response_format: format }),
    });
    if (!response.ok) throw new Error(await errorText(response));
    blob = await response.blob();
    if (format !== $("format").value) return; // the choice changed meanwhile
  }
  if (download.href) URL.revokeObjectURL(download.href);
  download.href = URL.createObjectURL(blob);
  download.download = `speech.${EXTENSIONS[format]}`;
  download.textContent = `Download ${label}`;
  download.classList.remove("disabled");
  download.setAttribute("aria-disabled", "false");
}

function stopSpeaking() {
  if (!current) return;
  current.controller.abort();
  current.context.close();
  current = null;
}

async function speak() {
  stopSpeaking();
  disableDownload();
  spoken = null;
  const status = $("status");
  const text = $("text").value.trim();
  if (!text) return say(status, "Type some text first.", true);
  const controller = new AbortController();
  const context = new AudioContext();
  current = { controller, context };
  $("speak").disabled = true;
  $("stop").disabled = false;
  say(status, "Generating...");
  const started = performance.now();
  // One seed for the speech and its download: a sampling model says the same thing twice.
  const body = {
    model: $("model").value,
    voice: $("voice").value,
    input: text,
    speed: Number($("speed").value),
    seed: Math.floor(Math.random() * 2 ** 31),
  };
  try {
    const response = await fetch("/v1/audio/speech", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ ...body, response_format: "pcm", stream_format: "audio" }),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    const rate = Number(response.headers.get("X-Sample-Rate")) || 24000;
    const reader = response.body.getReader();
    const kept = [];
    let carry = new Uint8Array(0); // an odd byte left over between network chunks
    let playAt = context.currentTime + 0.1;
    let seconds = 0;
    let firstAudio = null;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const bytes = new Uint8Array(carry.length + value.length);
      bytes.set(carry);
      bytes.set(value, carry.length);
      const whole = bytes.length - (bytes.length % 2);
      carry = bytes.slice(whole);
      if (!whole) continue;
      const pcm = new Int16Array(bytes.buffer.slice(0, whole));
      kept.push(pcm.buffer);
      const buffer = context.createBuffer(1, pcm.length, rate);
      const channel = buffer.getChannelData(0);
      for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
      const source = context.createBufferSource();
      source.buffer = buffer;
      source.connect(context.destination);
      playAt = Math.max(playAt, context.currentTime + 0.02);
      source.start(playAt);
      playAt += buffer.duration;
      seconds += buffer.duration;
      if (firstAudio === null) firstAudio = performance.now() - started;
      say(status, `Playing... ${seconds.toFixed(1)} s received (first audio after ${Math.round(firstAudio)} ms)`);
    }
    say(status, `Done: ${seconds.toFixed(1)} s of audio at ${rate} Hz, first audio after ${Math.round(firstAudio)} ms.`);
    spoken = { body, kept, rate };
    await prepareDownload();
  } catch (error) {
    if (error.name === "AbortError") say(status, "Stopped.");
    else say(status, `Error: ${error.message}`, true);
  } finally {
    $("speak").disabled = false;
    $("stop").disabled = true;
  }
}

async function upload(event) {
  event.preventDefault();
  const status = $("upload-status");
  say(status, "Uploading...");
  try {
    const form = new FormData($("upload"));
    const response = await fetch("/v1/audio/voices", { method: "POST", headers: headers(), body: form });
    if (!response.ok) throw new Error(await errorText(response));
    const voice = await response.json();
    await loadVoices(voice.id);
    say(status, `Voice "${voice.name}" is ready (${voice.id}).`);
  } catch (error) {
    say(status, `Error: ${error.message}`, true);
  }
}

function start() {
  $("speed").addEventListener("input", () => { $("speed-value").textContent = Number($("speed").value).toFixed(2); });
  $("speak").addEventListener("click", speak);
  $("format").addEventListener("change", () => prepareDownload().catch((error) => say($("status"), `Error: ${error.message}`, true)));
  $("stop").addEventListener("click", stopSpeaking);
  $("upload").addEventListener("submit", upload);
  $("api-key").addEventListener("change", refresh);
  refresh();
}

async function refresh() {
  try {
    await loadModels();
    await loadVoices();
    say($("status"), "Ready.");
  } catch (error) {
    say($("status"), `Error: ${error.message}`, true);
  }
}

start();
