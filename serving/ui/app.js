// The attention explorer: caption an image through the served model's REST API
// and show, word by word, where the model looked.
//
// Only TensorFlow Serving's public REST routes are called:
//   GET  /v1/models/NAME                          versions and their states
//   GET  /v1/models/NAME[/versions/V]/metadata     the signature's input name
//   POST /v1/models/NAME[/versions/V]:predict      {"instances": [{INPUT: {"b64": ...}}]}
// plus two optional documents next to this file (config.json: the default
// model; models/NAME/versions/V/captioner_export.json: the decoding the
// version was exported with). The page works without them.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const DRAWN_SIDE = 480;   // the view's drawing size (display only: the image is sent as chosen)
  const PANEL_SIDE = 160;   // a grid panel, as the figures' panels
  const FIRST_WORD_ID = 3;  // ids 0-2 are <pad>, <start>, <end>; words (and <unk>) follow
  const MAX_ERROR_CHARS = 400;

  const state = {
    model: "", version: "", inputName: null, versions: [],
    result: null,      // {words, steps, attention, locations, caption}
    base: null,        // ImageData of the image at the view's size
    panelBase: null,   // ImageData at the panel size
    alphas: new Map(), // "WIDTHxHEIGHT:step" -> Float32Array (the upsampled, smoothed map)
    word: 0,           // 0: the image alone; k: the k-th word
    asked: 0,          // caption requests started; only the newest one's answer is shown
    answered: 0,       // caption requests settled (shown, failed, or dropped as stale)
  };
  const timings = {};
  window.captioner = { state: state, timings: timings };  // read by the browser tests

  function setState(name) { document.body.dataset.state = name; }

  // -- REST -------------------------------------------------------------------------------

  async function api(path, options) {
    let response;
    try {
      response = await fetch(path, Object.assign({ cache: "no-store" }, options || {}));
    } catch (e) {
      return { status: 0, body: { error: String(e.message || e) } };
    }
    const text = await response.text();
    let body;
    try { body = text ? JSON.parse(text) : {}; } catch (e) { body = { error: text.trim() }; }
    return { status: response.status, body: body };
  }

  function modelPath(version) {
    const base = "/v1/models/" + encodeURIComponent(state.model);
    return version ? base + "/versions/" + encodeURIComponent(version) : base;
  }

  // One readable line for a failed call; the server's own message kept.
  function describeError(status, body, what) {
    let message = (body && (body.error || body.message)) || "no message";
    message = String(message).replace(/\s+/g, " ").trim();
    let line;
    if (status === 0) line = "Cannot reach the server (" + message + ")";
    else if (status === 413) line = "Too large for the server: " + message;
    else if (status === 429 || /RESOURCE_EXHAUSTED/.test(message))
      line = "The server is busy (RESOURCE_EXHAUSTED): " + message + " Try again in a moment.";
    else if (status === 400 && what === "caption") line = "The server refused the image: " + message;
    else if (status === 404) line = "Not found: " + message;
    else if (status === 503) line = "The server is unavailable: " + message;
    else line = what + " failed (HTTP " + status + "): " + message;
    return line.length > MAX_ERROR_CHARS ? line.slice(0, MAX_ERROR_CHARS - 1) + "…" : line;
  }

  function showError(line) {
    $("error").textContent = line;
    $("error").hidden = false;
    setState("error");
  }

  function clearError() { $("error").hidden = true; $("error").textContent = ""; }

  // -- the model: name, versions, signature, export record --------------------------------

  async function defaultModel() {
    const params = new URLSearchParams(location.search);
    if (params.get("model")) return params.get("model");
    const config = await api("config.json");
    return (config.status === 200 && config.body.model) || "captioner";
  }

  async function loadModel() {
    clearError();
    state.model = $("model").value.trim() || state.model;
    $("model").value = state.model;
    state.version = $("version").value;
    const status = await api(modelPath(""));
    if (status.status !== 200) {
      $("model-info").textContent = "Model " + state.model + ": not available";
      showError(describeError(status.status, status.body, "model status"));
      return false;
    }
    fillVersions(status.body.model_version_status || []);
    const version = state.version || (state.versions[0] || "");
    const [metadata, record] = await Promise.all([
      api(modelPath(state.version) + "/metadata"),
      version ? api("models/" + encodeURIComponent(state.model) + "/versions/" + version +
                    "/captioner_export.json") : Promise.resolve({ status: 404, body: {} })]);
    if (metadata.status !== 200) {
      showError(describeError(metadata.status, metadata.body, "model metadata"));
      return false;
    }
    state.inputName = imageInput(metadata.body);
    $("model-info").textContent = modelLine(version, record);
    const params = new URLSearchParams(location.search);
    params.set("model", state.model);
    if (state.version) params.set("version", state.version); else params.delete("version");
    history.replaceState(null, "", "?" + params.toString());
    setState("ready");
    return true;
  }

  function fillVersions(statuses) {
    const available = statuses.filter((s) => s.state === "AVAILABLE")
      .map((s) => String(s.version)).sort((a, b) => Number(b) - Number(a));
    state.versions = available;
    const select = $("version");
    const chosen = state.version;
    select.textContent = "";
    select.append(new Option("latest" + (available.length ? " (" + available[0] + ")" : ""), ""));
    for (const v of available) select.append(new Option(v, v));
    select.value = available.includes(chosen) ? chosen : "";
    state.version = select.value;
  }

  // The serving_default input taking the image bytes (a DT_STRING input).
  function imageInput(metadata) {
    try {
      const inputs = metadata.metadata.signature_def.signature_def.serving_default.inputs;
      const names = Object.keys(inputs);
      return names.find((n) => inputs[n].dtype === "DT_STRING") || names[0] || null;
    } catch (e) {
      return null;  // the page then sends {"b64": ...} alone, as for a one-input signature
    }
  }

  function modelLine(version, record) {
    const parts = [state.model + (version ? " version " + version : "")];
    const decoding = record.status === 200 && record.body.decoding;
    if (decoding) {
      parts.push(decoding.beam_size > 1 ? "beam size " + decoding.beam_size : "greedy (beam size 1)");
      parts.push("max length " + decoding.max_length);
    } else {
      parts.push("beam size not published by this server");
    }
    return parts.join(" · ");
  }

  // -- captioning --------------------------------------------------------------------------

  function readBase64(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  // The caption area emptied: the last image's words do not belong to this one.
  function clearResult() {
    $("caption").textContent = "";
    $("result").hidden = true;
    state.result = null;
  }

  // Captions `file`. Images chosen in quick succession each get a request; an answer
  // that comes back after a newer request started is dropped, so the page always
  // shows the latest image's caption whatever order the answers arrive in.
  async function caption(file) {
    if (!file) return;
    const request = ++state.asked;
    const current = () => request === state.asked;
    const name = file.name || "the pasted image";
    clearError();
    setState("captioning");
    $("caption").textContent = "Captioning " + name + "…";
    const times = { chosen: performance.now() };
    let b64;
    try {
      b64 = await readBase64(file);
    } catch (e) {
      state.answered++;
      if (!current()) return;
      clearResult();
      const why = String((e && (e.message || e.name)) || e || "unknown error")
        .replace(/\s+/g, " ").trim();
      showError(("Cannot read " + name + " to send it (" + why + "). Choose the file " +
                 "again, or another image.").slice(0, MAX_ERROR_CHARS));
      return;
    }
    const instance = state.inputName ? { [state.inputName]: { b64: b64 } } : { b64: b64 };
    const body = JSON.stringify({ signature_name: "serving_default", instances: [instance] });
    times.sent = performance.now();
    const [answer, image] = await Promise.all([
      api(modelPath(state.version) + ":predict", { method: "POST", body: body,
        headers: { "Content-Type": "application/json" } }),
      createImageBitmap(file).catch(() => null)]);
    times.answered = performance.now();
    state.answered++;
    if (!current()) return;  // a newer image was chosen meanwhile: its answer is the one shown
    Object.assign(timings, times);
    if (answer.status !== 200) {
      clearResult();
      showError(describeError(answer.status, answer.body, "caption"));
      return;
    }
    const prediction = (answer.body.predictions || [])[0];
    if (!prediction || typeof prediction.caption !== "string") {
      showError("The server's answer has no caption (is this a captioner model?)");
      return;
    }
    showResult(prediction, image, file.size);
  }

  // Words and the decoding steps they came from (reserved tokens and padding skipped).
  function wordsAndSteps(prediction) {
    const words = prediction.caption.split(" ").filter((w) => w.length);
    const tokens = prediction.tokens || [];
    const length = prediction.lengths !== undefined ? prediction.lengths : tokens.length;
    const steps = [];
    for (let t = 0; t < Math.min(length, tokens.length); t++) {
      if (tokens[t] >= FIRST_WORD_ID) steps.push(t);
    }
    if (steps.length !== words.length) return { words: words, steps: words.map((w, i) => i) };
    return { words: words, steps: steps };
  }

  function showResult(prediction, image, bytes) {
    const { words, steps } = wordsAndSteps(prediction);
    state.result = { words: words, steps: steps, caption: prediction.caption,
                     attention: prediction.attention || null,
                     locations: prediction.locations || null };
    state.alphas.clear();
    state.base = image ? imageData(image, DRAWN_SIDE) : null;
    state.panelBase = image ? imageData(image, PANEL_SIDE) : null;
    $("result").hidden = false;
    $("caption").textContent = prediction.caption || "(empty caption)";
    buildChips(words);
    const step = $("step");
    step.max = String(words.length);
    state.word = 0;
    select(0);
    if ($("grid-toggle").getAttribute("aria-pressed") === "true") buildGrid();
    timings.shown = performance.now();
    showTiming(bytes, prediction);
    if (!image) showError("The browser cannot draw this image format; the caption is the server's.");
    else if (!state.result.attention) showError("This model returns no attention maps.");
    else setState("captioned");
  }

  function showTiming(bytes, prediction) {
    const request = timings.answered - timings.sent;
    const total = timings.shown - timings.chosen;
    $("timing").textContent = "Caption in " + Math.round(total) + " ms (request " +
      Math.round(request) + " ms, " + (bytes / 1024).toFixed(1) + " KiB sent)" +
      (typeof prediction.score === "number" ? " · score " + prediction.score.toFixed(3) : "");
  }

  // -- drawing -----------------------------------------------------------------------------

  function fitted(width, height, side) {
    const scale = side / Math.max(width, height);
    return [Math.max(1, Math.round(width * scale)), Math.max(1, Math.round(height * scale))];
  }

  function imageData(image, side) {
    const [w, h] = fitted(image.width, image.height, side);
    const canvas = Object.assign(document.createElement("canvas"), { width: w, height: h });
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingQuality = "high";
    ctx.drawImage(image, 0, 0, w, h);
    return ctx.getImageData(0, 0, w, h);
  }

  // Bicubic kernel (a = -0.5) and window rules of PIL's BICUBIC resize, which the
  // figures use (serving/client/attention_figure.py: upsample_attention).
  function cubic(x) {
    const a = -0.5;
    x = Math.abs(x);
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
  }

  function axisWeights(inSize, outSize) {
    const scale = inSize / outSize;
    const filterScale = Math.max(scale, 1);
    const support = 2 * filterScale;
    const rows = [];
    for (let x = 0; x < outSize; x++) {
      const center = (x + 0.5) * scale;
      const lo = Math.max(0, Math.trunc(center - support + 0.5));
      const hi = Math.min(inSize, Math.trunc(center + support + 0.5));
      const weights = [];
      let sum = 0;
      for (let j = lo; j < hi; j++) {
        const w = cubic((j - center + 0.5) / filterScale);
        weights.push(w);
        sum += w;
      }
      rows.push({ lo: lo, weights: weights.map((w) => (sum ? w / sum : 0)) });
    }
    return rows;
  }

  // An (h, w) map upsampled to (outH, outW), clipped at 0 and scaled to [0, 1].
  function upsample(map, outW, outH) {
    const h = map.length, w = map[0].length;
    const across = axisWeights(w, outW), down = axisWeights(h, outH);
    const wide = new Float32Array(h * outW);
    for (let r = 0; r < h; r++) {
      for (let x = 0; x < outW; x++) {
        const { lo, weights } = across[x];
        let v = 0;
        for (let k = 0; k < weights.length; k++) v += weights[k] * map[r][lo + k];
        wide[r * outW + x] = v;
      }
    }
    const out = new Float32Array(outH * outW);
    let top = 0;
    for (let y = 0; y < outH; y++) {
      const { lo, weights } = down[y];
      for (let x = 0; x < outW; x++) {
        let v = 0;
        for (let k = 0; k < weights.length; k++) v += weights[k] * wide[(lo + k) * outW + x];
        v = v > 0 ? v : 0;
        out[y * outW + x] = v;
        if (v > top) top = v;
      }
    }
    if (top > 0) for (let i = 0; i < out.length; i++) out[i] /= top;
    return out;
  }

  function alphaFor(step, width, height) {
    const key = width + "x" + height + ":" + step;
    if (!state.alphas.has(key)) state.alphas.set(key, upsample(state.result.attention[step], width, height));
    return state.alphas.get(key);
  }

  // The image lit by the attention, as the figures draw it: unattended parts dimmed,
  // attended parts brightened towards white.
  function lit(base, alpha) {
    const out = new ImageData(base.width, base.height);
    const src = base.data, dst = out.data;
    for (let i = 0, p = 0; i < alpha.length; i++, p += 4) {
      const a = alpha[i];
      for (let c = 0; c < 3; c++) {
        const b = src[p + c] / 255;
        const v = b * (0.25 + 0.75 * a) + 0.45 * a * (1 - b);
        dst[p + c] = v >= 1 ? 255 : Math.round(v * 255);
      }
      dst[p + 3] = 255;
    }
    return out;
  }

  // A location-wise attention's window: centre (x, y) and scale s in [-1, 1] grid
  // coordinates; the window spans centre ± s on both axes.
  function drawGlimpse(ctx, location, width, height) {
    if (!location || location.length < 3) return;
    const [cx, cy, s] = location;
    const x0 = (cx - s + 1) / 2 * width, x1 = (cx + s + 1) / 2 * width;
    const y0 = (cy - s + 1) / 2 * height, y1 = (cy + s + 1) / 2 * height;
    ctx.lineWidth = Math.max(2, width / 120);
    ctx.strokeStyle = "rgba(0, 0, 0, 0.8)";
    ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
    ctx.lineWidth /= 2;
    ctx.strokeStyle = "#ffd400";
    ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
  }

  function drawWord(canvas, base, word) {
    canvas.width = base.width;
    canvas.height = base.height;
    const ctx = canvas.getContext("2d");
    const result = state.result;
    const step = word > 0 ? result.steps[word - 1] : -1;
    if (step < 0 || !result.attention || !result.attention[step]) {
      ctx.putImageData(base, 0, 0);  // the image alone
      return;
    }
    ctx.putImageData(lit(base, alphaFor(step, base.width, base.height)), 0, 0);
    if (result.locations) drawGlimpse(ctx, result.locations[step], base.width, base.height);
  }

  // -- words: chips, slider, keys, grid -----------------------------------------------------

  function buildChips(words) {
    const box = $("words");
    box.textContent = "";
    words.forEach((word, i) => {
      const chip = document.createElement("button");
      chip.type = "button";
      chip.className = "chip";
      chip.textContent = word;
      chip.dataset.word = String(i + 1);
      chip.setAttribute("aria-label", "Word " + (i + 1) + " of " + words.length + ": " + word);
      chip.setAttribute("aria-pressed", "false");
      chip.tabIndex = i === 0 ? 0 : -1;
      for (const type of ["mouseenter", "focus", "click"]) {
        chip.addEventListener(type, () => select(i + 1));
      }
      box.append(chip);
    });
  }

  function select(word) {
    const result = state.result;
    if (!result) return;
    state.word = Math.max(0, Math.min(word, result.words.length));
    $("step").value = String(state.word);
    const label = state.word ? result.words[state.word - 1] : "(image)";
    $("step-word").textContent = label;
    for (const chip of $("words").children) {
      const on = Number(chip.dataset.word) === state.word;
      chip.setAttribute("aria-pressed", on ? "true" : "false");
      chip.tabIndex = on || (state.word === 0 && chip.dataset.word === "1") ? 0 : -1;
    }
    const view = $("view");
    view.setAttribute("aria-label", state.word
      ? "The image, lit where the model looked for the word " + label
      : "The image");
    if (state.base) drawWord(view, state.base, state.word);
    for (const panel of $("grid").querySelectorAll("button")) {
      panel.setAttribute("aria-pressed", Number(panel.dataset.word) === state.word ? "true" : "false");
    }
  }

  function onWordKeys(event) {
    const result = state.result;
    if (!result) return;
    const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
    let word = state.word;
    if (event.key in moves) word = Math.max(1, Math.min(result.words.length, word + moves[event.key]));
    else if (event.key === "Home") word = 1;
    else if (event.key === "End") word = result.words.length;
    else return;
    event.preventDefault();
    const chip = $("words").querySelector('[data-word="' + word + '"]');
    if (chip) chip.focus();  // focus selects it
  }

  function buildGrid() {
    const grid = $("grid");
    grid.textContent = "";
    const result = state.result;
    if (!result || !state.panelBase) return;
    for (let k = 0; k <= result.words.length; k++) {
      const panel = document.createElement("button");
      panel.type = "button";
      panel.dataset.word = String(k);
      const label = k ? result.words[k - 1] : "(image)";
      panel.setAttribute("aria-label", k ? "Show the word " + label : "Show the image alone");
      panel.setAttribute("aria-pressed", k === state.word ? "true" : "false");
      const canvas = document.createElement("canvas");
      drawWord(canvas, state.panelBase, k);
      const name = document.createElement("span");
      name.textContent = label;
      panel.append(canvas, name);
      panel.addEventListener("click", () => select(k));
      grid.append(panel);
    }
  }

  function toggleGrid() {
    const button = $("grid-toggle");
    const on = button.getAttribute("aria-pressed") !== "true";
    button.setAttribute("aria-pressed", on ? "true" : "false");
    $("grid").hidden = !on;
    if (on) buildGrid();
  }

  // -- input: choose, drop, paste -------------------------------------------------------------

  function firstImage(list) {
    const files = Array.from(list || []);
    return files.find((f) => f.type.startsWith("image/")) || files[0] || null;
  }

  function wireInput() {
    $("file").addEventListener("change", (e) => caption(firstImage(e.target.files)));
    const drop = $("drop");
    drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (e) => {
      e.preventDefault();
      drop.classList.remove("over");
      caption(firstImage(e.dataTransfer.files));
    });
    document.addEventListener("paste", (e) => {
      const file = firstImage(e.clipboardData && e.clipboardData.files);
      if (file) { e.preventDefault(); caption(file); }
    });
  }

  window.captioner.describeError = describeError;

  async function start() {
    setState("loading");
    wireInput();
    $("words").addEventListener("keydown", onWordKeys);
    $("step").addEventListener("input", () => select(Number($("step").value)));
    $("grid-toggle").addEventListener("click", toggleGrid);
    $("model-form").addEventListener("submit", (e) => { e.preventDefault(); loadModel(); });
    $("version").addEventListener("change", () => loadModel());
    const params = new URLSearchParams(location.search);
    state.model = await defaultModel();
    $("model").value = state.model;
    state.version = params.get("version") || "";
    if (state.version) $("version").append(new Option(state.version, state.version));
    $("version").value = state.version;
    await loadModel();
    timings.ready = performance.now();
  }

  start();
})();
