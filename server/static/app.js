// Tolk's translation page: languages from /languages, defaults and limits from /settings, and the translation
// streamed from POST /translate/stream. Stopping aborts the fetch, which closes the connection, and the server
// then cancels the request and frees its rows.
"use strict";

const OPTIONS = ["beam_size", "length_penalty", "do_sample", "temperature", "top_k", "top_p", "seed",
  "max_new_tokens", "min_new_tokens", "repetition_penalty", "no_repeat_ngram_size"];
// Statuses of the errors that arrive as an SSE `error` event, once the stream has started.
const STREAM_ERRORS = { timeout: 504, engine_failure: 500, not_ready: 503, shutting_down: 503 };
const $ = (id) => document.getElementById(id);
const el = {};
for (const id of ["form", "source", "target", "swap", "text", "counter", "clear", "output", "stats", "copy",
  "translate", "stop", "status", "error", "settings", "reset", "live", "key-field", "api_key", "files", "file",
  "translate-file", "formats", "file-status", "file-error", "file-link", ...OPTIONS]) {
  el[id] = $(id);
}

const state = {
  languages: [],   // [{code, name, targets}]
  models: [],      // [{name, source, target}]
  defaults: {},    // model name -> generation defaults
  limits: {},      // the server's limits (GET /settings)
  running: null,   // AbortController of the translation in flight
  typing: 0,       // timer of "translate while typing"
};

let displayNames = null;
try {
  displayNames = new Intl.DisplayNames(["en"], { type: "language" });  // the page is in English
} catch (_) { /* older browsers: codes are shown as they are */ }

const AUTO = "auto";  // the source that the server detects, text by text

function languageName(code) {
  if (code === AUTO) return "Detect language";
  const known = state.languages.find((l) => l.code === code);
  if (known && known.name !== code) return known.name;
  try { return (displayNames && displayNames.of(code)) || code; } catch (_) { return code; }
}

// ------------------------------------------------------------ messages

function say(text) { el.status.textContent = text; }

function showError(text) {
  el.error.textContent = text;
  el.error.hidden = !text;
}

class ServerError extends Error {
  constructor(status, body, retryAfter) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
    this.type = body && body.error_type;
    this.retryAfter = retryAfter;
  }
}

async function serverError(response) {
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON: the status says enough */ }
  return new ServerError(response.status, body, response.headers.get("Retry-After"));
}

// A sentence a person can act on, for each kind of failure.
function explain(err) {
  if (err instanceof TypeError) return "Cannot reach the server. Check that it is running and reachable.";
  if (!(err instanceof ServerError)) return `The translation was interrupted: ${err.message}.`;
  const detail = err.message.replace(/\bq\[0\]/g, "the text");  // the page sends one text, q[0]
  switch (err.status) {
    case 413: return `The text is too long: ${detail.replace(/^the text /, "it ")}. `
      + "Shorten it, or translate it in parts.";
    case 429: {
      const wait = err.retryAfter ? ` in ${err.retryAfter} s` : " in a moment";
      return `The server is busy with other translations. Try again${wait}.`;
    }
    case 503: return err.type === "shutting_down"
      ? "The server is shutting down. Try again when it is back."
      : "The server is not ready yet: its models are still loading. Try again in a moment.";
    case 504: return `The translation took too long and the server stopped it: ${detail}`;
    case 401: return "This server needs an API key: enter it under Generation settings.";
    case 403: return `The server refused the API key: ${detail}`;
    case 422: return `A generation setting is not accepted: ${detail}`;
    case 400: return `The server cannot translate this: ${detail}`;
    default: return `The translation failed (${err.status}): ${detail}`;
  }
}

// ------------------------------------------------------------ loading languages and settings

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw await serverError(response);
  return response.json();
}

async function load(attempt = 0) {
  try {
    const [languages, settings, models] = await Promise.all(
      ["/languages", "/settings", "/models"].map(getJSON));
    state.languages = languages;
    state.models = models;
    state.defaults = settings.defaults;
    state.limits = settings.limits;
  } catch (err) {
    const wait = Math.min(10, 1 + attempt);
    showError(`${explain(err)} Retrying in ${wait} s…`);
    setTimeout(() => load(attempt + 1), wait * 1000);
    return;
  }
  showError("");
  el["key-field"].hidden = !state.limits.api_key_required;
  el.max_new_tokens.max = state.limits.max_new_tokens;
  el.min_new_tokens.max = state.limits.max_new_tokens;
  el.beam_size.max = Math.min(state.limits.max_beam_size, state.limits.max_batch_rows);
  fillSources(localStorage.getItem("tolk.source"), localStorage.getItem("tolk.target") || firstTarget());
  el.source.disabled = el.target.disabled = el.translate.disabled = false;
  updateCounter();
  say(state.languages.length ? "" : "The server has no models loaded.");
  loadFiles();
}

function options(select, codes, chosen) {
  select.replaceChildren(...codes.map((code) => new Option(languageName(code), code)));
  if (codes.includes(chosen)) select.value = chosen;
}

// A first visit opens on a target the visitor likely wants: not their browser's language, which is the one they
// are likely to type, and the server's first model's target before the others. Later visits open on their choice.
function firstTarget() {
  const typed = (navigator.languages || [navigator.language]).map((tag) => tag.split("-")[0].toLowerCase());
  const targets = [...new Set(state.languages.flatMap((l) => l.targets))].sort();
  const candidates = [...state.models.map((m) => m.target).filter((t) => targets.includes(t)), ...targets];
  return candidates.find((t) => !typed.includes(t.split("-")[0].toLowerCase())) || candidates[0] || null;
}

// Detection is offered when there is something to tell apart: more than one source language.
function fillSources(source, target) {
  const codes = state.languages.map((l) => l.code);
  options(el.source, codes.length > 1 ? [AUTO, ...codes] : codes, source);
  fillTargets(target);
}

function fillTargets(target) {
  const targets = el.source.value === AUTO
    ? [...new Set(state.languages.flatMap((l) => l.targets))].sort()
    : (state.languages.find((l) => l.code === el.source.value) || { targets: [] }).targets;
  options(el.target, targets, target);
  pairChanged();
}

// With detection, the model is known only once the text is: the first one into the target stands in for it.
function currentModel() {
  return state.models.find((m) => (el.source.value === AUTO || m.source === el.source.value)
    && m.target === el.target.value);
}

function pairChanged() {
  localStorage.setItem("tolk.source", el.source.value);
  localStorage.setItem("tolk.target", el.target.value);
  const back = state.languages.find((l) => l.code === el.target.value);
  const reversible = Boolean(back && back.targets.includes(el.source.value));
  el.swap.disabled = !reversible;
  el.swap.title = reversible ? "Swap languages"
    : el.source.value === AUTO ? "Choose the source language to swap"
      : `No model translates ${languageName(el.target.value)} to ${languageName(el.source.value)}`;
  resetSettings();
}

function swap() {
  const [source, target] = [el.target.value, el.source.value];
  if (el.output.value) el.text.value = el.output.value;
  setOutput("", "idle");
  fillSources(source, target);
  updateCounter();
}

// ------------------------------------------------------------ generation settings

function defaults() {
  const model = currentModel();
  return (model && state.defaults[model.name]) || {};
}

function resetSettings() {
  const values = defaults();
  for (const name of OPTIONS) {
    const input = el[name];
    if (input.type === "checkbox") input.checked = Boolean(values[name]);
    else input.value = values[name] ?? "";
  }
  samplingChanged();
}

function samplingChanged() {
  for (const name of ["temperature", "top_k", "top_p", "seed"]) el[name].disabled = !el.do_sample.checked;
}

// Only the settings that differ from the model's defaults are sent, so the server's defaults keep applying.
function changedOptions() {
  const base = defaults();
  const changed = {};
  for (const name of OPTIONS) {
    const input = el[name];
    if (input.disabled) continue;
    let value;
    if (input.type === "checkbox") value = input.checked;
    else if (input.value.trim() === "") value = null;
    else value = Number(input.value);
    if (value !== (base[name] ?? null)) changed[name] = value;
  }
  return changed;
}

// ------------------------------------------------------------ the text and its counter

function countChars(text) {
  return [...text].length;  // code points, as the server counts them
}

function updateCounter() {
  const n = countChars(el.text.value);
  const limit = state.limits.max_text_chars;
  const over = limit && n > limit;
  const excess = over ? ` (${(n - limit).toLocaleString()} over the limit)` : "";
  el.counter.textContent = limit
    ? `${n.toLocaleString()} / ${limit.toLocaleString()} characters${excess}`
    : `${n.toLocaleString()} characters`;
  el.counter.classList.toggle("over", Boolean(over));
  el.text.setAttribute("aria-invalid", over ? "true" : "false");
}

// ------------------------------------------------------------ translating

function setOutput(text, outputState) {
  el.output.value = text;
  el.output.dataset.state = outputState;
  el.copy.disabled = !text;
}

function setRunning(running) {
  el.stop.disabled = !running;
  el.output.setAttribute("aria-busy", running ? "true" : "false");
  if (!running && document.activeElement === el.stop) el.translate.focus();
}

// Server-sent events from a fetch body: yields {event, data} as each event's blank line arrives.
async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "message";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    // a lone CR at the end may be the first half of a CRLF: wait for the next chunk
    while ((end = /\r\n|\n|\r(?=[^\n])/.exec(buffer))) {
      const line = buffer.slice(0, end.index);
      buffer = buffer.slice(end.index + end[0].length);
      if (line === "") {
        if (data.length) yield { event, data: data.join("\n") };
        event = "message";
        data = [];
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "event") event = text;
        else if (field === "data") data.push(text);
      }
    }
  }
}

function requestHeaders() {
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  const key = el.api_key.value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function translate() {
  stop(false);
  const text = el.text.value;
  if (!text.trim()) {
    setOutput("", "idle");
    say("");
    showError("Type or paste some text to translate.");
    return;
  }
  const controller = new AbortController();
  state.running = controller;
  const opts = changedOptions();
  const body = { q: text, source: el.source.value, target: el.target.value, options: opts };
  const started = performance.now();
  let pieces = 0;
  let finished = null;
  showError("");
  setOutput("", "streaming");
  el.output.dataset.pieces = "0";
  el.stats.textContent = "";
  setRunning(true);
  say((opts.beam_size || defaults().beam_size) > 1
    ? "Translating with beam search; the text appears when it is finished…" : "Translating…");
  try {
    const response = await fetch("/translate/stream", {
      method: "POST", headers: requestHeaders(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) throw await serverError(response);
    for await (const { event, data } of readEvents(response.body)) {
      const payload = JSON.parse(data);
      if (event === "token") {
        pieces += 1;
        el.output.value += payload.token.text;
        el.output.dataset.pieces = String(pieces);
        el.output.scrollTop = el.output.scrollHeight;
        el.copy.disabled = false;
      } else if (event === "done") {
        finished = payload;
        el.output.value = payload.translatedText;  // the same text as the pieces, by the server's contract
      } else if (event === "error") {
        throw new ServerError(STREAM_ERRORS[payload.error_type] || 500, payload, null);
      }
    }
    if (!finished) throw new Error("the stream ended early");
    const seconds = (performance.now() - started) / 1000;
    setOutput(el.output.value, "done");
    const detected = finished.detectedLanguage;
    el.stats.textContent = `${finished.generated_tokens} tokens in ${seconds.toFixed(1)} s`
      + (detected ? ` · detected ${languageName(detected.language)} (${Math.round(detected.confidence)}%)` : "");
    say(finished.finish_reason === "length"
      ? "Done, but the translation was cut at the length limit (Most new tokens in Generation settings)."
      : finished.finish_reason === "cancelled" ? "The server stopped before the translation was finished."
        : "Translation done.");
  } catch (err) {
    if (controller.signal.aborted) {
      if (state.running === null || state.running === controller) {
        el.output.dataset.state = "stopped";
        say(el.output.value ? "Stopped. The translation so far is kept." : "Stopped.");
      }
      return;
    }
    el.output.dataset.state = "error";
    say("");
    showError(explain(err));
    if (err instanceof ServerError && [401, 403, 422].includes(err.status)) el.settings.open = true;
  } finally {
    if (state.running === controller) {
      state.running = null;
      setRunning(false);
    }
  }
}

// Aborting the fetch closes the connection; the server sees it and cancels the request.
function stop(userAsked = true) {
  const controller = state.running;
  if (!controller) return;
  if (!userAsked) state.running = null;  // a new translation replaces this one
  controller.abort();
}

async function copy() {
  const text = el.output.value;
  if (!text) return;
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {  // no Clipboard API (a page served over plain http to another machine): select and copy
    el.output.select();
    document.execCommand("copy");
  }
  say("Translation copied to the clipboard.");
}

// ------------------------------------------------------------ documents (POST /translate_file)

// Offered when the server translates files (LibreTranslate's /frontend/settings says so), for the formats it lists.
async function loadFiles() {
  let settings;
  try {
    settings = await getJSON("/frontend/settings");
  } catch (_) {
    return;  // the text translation works without it
  }
  if (!settings.filesTranslation) return;
  el.file.accept = settings.supportedFilesFormat.join(",");
  el.formats.textContent = `Its formatting is kept. Formats: ${settings.supportedFilesFormat.join(" ")}`;
  el.files.hidden = false;
}

function fileChanged() {
  el["translate-file"].disabled = !el.file.files.length;
  el["file-link"].hidden = true;
  el["file-error"].hidden = true;
  el["file-status"].textContent = "";
}

async function translateFile() {
  const file = el.file.files[0];
  if (!file) return;
  const data = new FormData();  // the fields LibreTranslate's page sends
  data.append("file", file);
  data.append("source", el.source.value);
  data.append("target", el.target.value);
  const headers = {};
  const key = el.api_key.value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  el["translate-file"].disabled = true;
  el["file-link"].hidden = el["file-error"].hidden = true;
  el["file-status"].textContent = `Translating ${file.name}…`;
  try {
    const response = await fetch("/translate_file", { method: "POST", headers, body: data });
    if (!response.ok) throw await serverError(response);
    const url = (await response.json()).translatedFileUrl;
    const name = decodeURIComponent(url.split("/").pop()).replace(/^[^.]*\./, "");  // after the file's id
    el["file-link"].href = url;
    el["file-link"].download = name;
    el["file-link"].textContent = `Download ${name}`;
    el["file-link"].hidden = false;
    el["file-status"].textContent = `${file.name} is translated.`;
  } catch (err) {
    el["file-status"].textContent = "";
    el["file-error"].textContent = err instanceof ServerError && [400, 413].includes(err.status)
      ? `The server cannot translate this document: ${err.message}` : explain(err);
    el["file-error"].hidden = false;
  } finally {
    el["translate-file"].disabled = !el.file.files.length;
  }
}

// ------------------------------------------------------------ wiring

el.file.addEventListener("change", fileChanged);
el["translate-file"].addEventListener("click", translateFile);

el.form.addEventListener("submit", (event) => { event.preventDefault(); translate(); });
el.stop.addEventListener("click", () => stop());
el.copy.addEventListener("click", copy);
el.swap.addEventListener("click", swap);
el.source.addEventListener("change", () => fillTargets(el.target.value));
el.target.addEventListener("change", pairChanged);
el.do_sample.addEventListener("change", samplingChanged);
el.reset.addEventListener("click", resetSettings);
el.clear.addEventListener("click", () => {
  stop();
  el.text.value = "";
  setOutput("", "idle");
  updateCounter();
  showError("");
  say("");
  el.text.focus();
});
el.text.addEventListener("input", () => {
  updateCounter();
  clearTimeout(state.typing);
  if (el.live.checked) state.typing = setTimeout(translate, 600);
});
el.live.checked = localStorage.getItem("tolk.live") === "1";
el.live.addEventListener("change", () => localStorage.setItem("tolk.live", el.live.checked ? "1" : "0"));
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !el.translate.disabled) {
    event.preventDefault();
    translate();
  } else if (event.key === "Escape" && state.running) {
    event.preventDefault();
    stop();
  }
});

load();
