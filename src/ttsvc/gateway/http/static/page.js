// The try-it page: same-origin requests only, relative URLs (so the page also works behind a
// reverse proxy that mounts the service under a path), no libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const result = $("result");
let audioContext = null;
let objectUrl = null;
let speaking = 0; // which request the page is playing: counts the clicks on Speak

function headers(json) {
  const h = json ? { "content-type": "application/json" } : {};
  const key = $("key").value.trim();
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
  result.dataset.state = "error";
}

// The API answers every refusal with {error, type, field?}: show all three as they are.
async function apiError(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    return `HTTP ${response.status}`;
  }
  const err = body.error && typeof body.error === "object" ? body.error : body; // OpenAI shape too
  const field = err.field || err.param;
  return `${response.status} ${err.type}: ${err.error || err.message}${field ? ` (field: ${field})` : ""}`;
}

async function loadVoices() {
  const select = $("voice");
  const response = await fetch("voices", { headers: headers(false) });
  if (!response.ok) {
    showError(`could not list voices: ${await apiError(response)}`);
    return;
  }
  const previous = select.value;
  select.replaceChildren();
  for (const voice of (await response.json()).voices) {
    const option = document.createElement("option");
    option.value = voice.name;
    const language = voice.language && (voice.language.name || voice.language.code);
    option.textContent = language ? `${voice.name} (${language})` : voice.name;
    select.append(option);
  }
  if (previous) select.value = previous;
  if (!select.value && select.options.length) select.selectedIndex = 0;
  $("error").hidden = true;
  result.dataset.state = "idle";
}

function progress(bytes, samples) {
  result.dataset.bytes = String(bytes);
  result.dataset.samples = String(samples);
  $("received").textContent = samples
    ? `${bytes} bytes, ${(samples / Number(result.dataset.rate)).toFixed(2)} s of audio`
    : `${bytes} bytes`;
}

function firstAudio(started, how) {
  const ms = performance.now() - started;
  $("ttfa-how").textContent = how;
  result.dataset.ttfaMs = ms.toFixed(0);
  $("ttfa").textContent = `${ms.toFixed(0)} ms`;
}

// The response's non-empty chunks as they arrive; ``onFirst`` is told of the first one.
async function* arriving(response, onFirst) {
  const reader = response.body.getReader();
  let first = true;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    if (!value.length) continue;
    if (first && onFirst) onFirst();
    first = false;
    yield value;
  }
}

// The audio as a file to keep: a blob URL behind the download link.
function offerDownload(blob, name) {
  if (objectUrl) URL.revokeObjectURL(objectUrl);
  objectUrl = URL.createObjectURL(blob);
  const link = $("download");
  link.href = objectUrl;
  link.download = name;
  link.hidden = false;
  return objectUrl;
}

// 16-bit mono PCM chunks as a WAV file (44-byte header, then the samples).
function wavOf(parts, bytes, rate) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (at, s) => [...s].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF"); header.setUint32(4, 36 + bytes, true); text(8, "WAVE");
  text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true);
  header.setUint16(22, 1, true); header.setUint32(24, rate, true);
  header.setUint32(28, 2 * rate, true); header.setUint16(32, 2, true);
  header.setUint16(34, 16, true); text(36, "data"); header.setUint32(40, bytes, true);
  return new Blob([header, ...parts], { type: "audio/wav" });
}

// The timestamped route's JSON lines as {pcm, words} pieces (its last line, {done}, ends
// them): each line's audio is base64 PCM whose words start in it.
async function* timedPieces(response, onFirst) {
  const decoder = new TextDecoder();
  let pending = "";
  for await (const value of arriving(response, onFirst)) {
    pending += decoder.decode(value, { stream: true });
    const lines = pending.split("\n");
    pending = lines.pop();
    for (const line of lines) {
      if (!line.trim()) continue;
      const piece = JSON.parse(line);
      if (piece.done) return;
      const raw = atob(piece.audio);
      const pcm = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) pcm[i] = raw.charCodeAt(i);
      yield { pcm, words: piece.words };
    }
  }
}

// The plain audio stream as the same pieces, without words.
async function* plainPieces(response, onFirst) {
  for await (const value of arriving(response, onFirst)) yield { pcm: value, words: [] };
}

// The word being spoken, marked in the text it came from (its text_span), on the audio clock;
// a word of an earlier request (its timer still pending) marks nothing.
function highlight(text, word, at, turn) {
  const delay = Math.max(0, (at - audioContext.currentTime) * 1000);
  setTimeout(() => {
    if (turn !== speaking) return;
    const [start, end] = word.text_span;
    const mark = document.createElement("mark");
    mark.textContent = text.slice(start, end);
    $("spoken").replaceChildren(text.slice(0, start), mark, text.slice(end));
    result.dataset.highlighted = String(Number(result.dataset.highlighted || 0) + 1);
  }, delay);
}

// format=pcm: 16-bit little-endian mono, played piece by piece as it arrives, its words
// highlighted as they are heard.
async function playPcm(response, started, text, turn) {
  const rate = Number(response.headers.get("x-sample-rate"));
  result.dataset.rate = String(rate);
  let playAt = 0;
  let carry = null; // an odd byte left over from the previous chunk
  let bytes = 0;
  let samples = 0;
  let played = 0;
  const parts = [];
  result.dataset.played = "0";
  $("spoken").textContent = text;
  // the first chunk is heard as soon as it is scheduled (50 ms ahead of the audio clock)
  const onFirst = () => firstAudio(started, "(first audio bytes)");
  const timed = response.headers.get("content-type").startsWith("application/x-ndjson");
  const pieces = timed ? timedPieces(response, onFirst) : plainPieces(response, onFirst);
  for await (const { pcm: value, words } of pieces) {
    bytes += value.length;
    parts.push(value);
    let data = value;
    if (carry !== null) {
      data = new Uint8Array(value.length + 1);
      data[0] = carry;
      data.set(value, 1);
      carry = null;
    }
    if (data.length % 2) {
      carry = data[data.length - 1];
      data = data.subarray(0, data.length - 1);
    }
    const count = data.length / 2;
    const startsAt = Math.max(playAt, audioContext.currentTime + 0.05);
    // the words starting in this piece (a piece may carry words before its audio): heard as far
    // after the piece's first sample as they are after it in the stream (the samples before it)
    for (const word of words) highlight(text, word, startsAt + word.start - samples / rate, turn);
    if (!count) continue;
    const view = new DataView(data.buffer, data.byteOffset, data.length);
    const buffer = audioContext.createBuffer(1, count, rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < count; i++) channel[i] = view.getInt16(2 * i, true) / 32768;
    const source = audioContext.createBufferSource();
    source.buffer = buffer;
    source.connect(audioContext.destination);
    source.onended = () => {
      // what the audio clock actually got through, not just what arrived
      played += count;
      result.dataset.played = String(played);
    };
    playAt = startsAt;
    source.start(playAt);
    playAt += buffer.duration;
    samples += count;
    progress(bytes, samples);
  }
  offerDownload(wavOf(parts, 2 * samples, rate), "speech.wav");
}

// Other formats: the browser's decoder needs the whole file, so collect it, then play it.
// Its time to first audio is when the player starts to sound, not when the first bytes came:
// nothing can be heard before the whole file is here.
async function playWhole(response, started, format) {
  const parts = [];
  let bytes = 0;
  for await (const value of arriving(response, null)) {
    bytes += value.length;
    parts.push(value);
    progress(bytes, 0);
  }
  const type = (response.headers.get("content-type") || "").split(";")[0];
  const player = $("player");
  player.addEventListener("playing", () => firstAudio(started, "(first sound)"), { once: true });
  player.src = offerDownload(new Blob(parts, { type }), `speech.${format === "opus" ? "ogg" : format}`);
  player.hidden = false;
  player.play().catch(() => {}); // autoplay may be refused: the controls are there
}

async function speak(event) {
  event.preventDefault();
  const turn = ++speaking;
  const button = $("speak");
  button.disabled = true;
  $("error").hidden = true;
  $("ttfa").textContent = "-";
  $("received").textContent = "-";
  $("player").hidden = true;
  $("download").hidden = true;
  $("ttfa-how").textContent = "";
  $("spoken").textContent = "";
  delete result.dataset.highlighted;
  delete result.dataset.ttfaMs;
  result.dataset.state = "waiting";
  progress(0, 0);
  const format = $("format").value;
  const body = {
    text: $("text").value,
    format,
    speed: Number($("speed").value),
  };
  if ($("voice").value) body.voice = $("voice").value;
  if ($("rate").value) body.sample_rate = Number($("rate").value);
  body.ssml = $("ssml").checked; // unchecked: markup is read out as text, not as SSML
  if (format === "pcm") {
    // created in the click's handler: browsers only let a user gesture start audio
    audioContext = audioContext || new AudioContext();
    await audioContext.resume();
  }
  const started = performance.now();
  try {
    const post = (path) =>
      fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(body) });
    // pcm comes with its word times, to mark each word as it is heard; a voice compiled without
    // phoneme durations has none (409): then the plain stream
    let response = await post(format === "pcm" ? "synthesize/with-timestamps" : "synthesize");
    if (format === "pcm" && response.status === 409) response = await post("synthesize");
    if (!response.ok) {
      showError(await apiError(response));
      return;
    }
    result.dataset.state = "streaming";
    await (format === "pcm"
      ? playPcm(response, started, body.text, turn)
      : playWhole(response, started, format));
    result.dataset.state = "done";
  } catch (err) {
    showError(`request failed: ${err}`);
  } finally {
    button.disabled = false;
  }
}

$("speak-form").addEventListener("submit", speak);
$("speed").addEventListener("input", () => {
  $("speed-value").textContent = Number($("speed").value).toFixed(2);
});
// Switching SSML on wraps plain text in a document to start from; off leaves the text alone.
$("ssml").addEventListener("change", () => {
  const text = $("text");
  if ($("ssml").checked && !text.value.trim().startsWith("<speak")) {
    text.value = `<speak>${text.value.replace(/&/g, "&amp;").replace(/</g, "&lt;")}</speak>`;
  }
});
$("key").addEventListener("change", loadVoices);
loadVoices();
