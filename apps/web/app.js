// framegraph live page: microphone → server over a WebSocket (protocol: apps/PROTOCOL.md, version 1)
// → live canvas, with glass-to-glass latency, FPS and drops. JPEG frames are decoded with
// createImageBitmap; H.264 (Annex-B) with WebCodecs where the browser has it.
"use strict";

const HEADER_BYTES = 48;
const KIND = { JPEG: 1, H264: 2, PCM16: 3 };
const FLAG = { KEYFRAME: 1, DISCONTINUITY: 2, INTERRUPTED: 4, CLIENT_CLOCK: 8 };
const $ = (id) => document.getElementById(id);

const params = new URLSearchParams(location.search);
const defaultUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host || "127.0.0.1:8765"}/ws`;
$("url").value = params.get("url") || defaultUrl;

let ws = null, mic = null, player = null, decoder = null;
let session = null;
const view = $("view"), g = view.getContext("2d");
const m = { frames: [], g2g: [], server: [], drops: 0, firstFrame: null, startedAt: 0, stats: null };

function log(text, cls) {
  const line = document.createElement("div");
  line.textContent = `${new Date().toLocaleTimeString()}  ${text}`;
  if (cls) line.className = cls;
  $("log").prepend(line);
}

function nowNs() { return BigInt(Math.round(performance.now() * 1e6)); }

// ---- media header ----------------------------------------------------------------------------------
function packHeader(kind, seq, pts, captureNs, payloadLen) {
  const b = new ArrayBuffer(HEADER_BYTES), v = new DataView(b);
  v.setUint8(0, 0x46); v.setUint8(1, 0x47);              // "FG"
  v.setUint8(2, 1); v.setUint8(3, kind);                 // version, kind
  v.setUint16(4, 0, true); v.setUint16(6, HEADER_BYTES, true);
  v.setUint32(8, seq >>> 0, true);
  v.setBigInt64(12, BigInt(pts), true);
  v.setBigInt64(20, captureNs, true);
  v.setUint32(44, payloadLen, true);                     // timings (28..43) are zero from a client
  return new Uint8Array(b);
}

function parseHeader(buf) {
  const v = new DataView(buf);
  if (buf.byteLength < HEADER_BYTES || v.getUint8(0) !== 0x46 || v.getUint8(1) !== 0x47) throw new Error("bad media header");
  const headerLen = v.getUint16(6, true);
  return {
    kind: v.getUint8(3), flags: v.getUint16(4, true), seq: v.getUint32(8, true),
    pts: Number(v.getBigInt64(12, true)), captureNs: v.getBigInt64(20, true),
    graphUs: v.getUint32(28, true), computeUs: v.getUint32(32, true), encodeUs: v.getUint32(36, true),
    sendWaitUs: v.getUint32(40, true), payload: new Uint8Array(buf, headerLen, v.getUint32(44, true)),
  };
}

// ---- session ---------------------------------------------------------------------------------------
function start() {
  const url = new URL($("url").value);
  if (params.get("token")) url.searchParams.set("token", params.get("token"));
  Object.assign(m, { frames: [], g2g: [], server: [], drops: 0, firstFrame: null, stats: null, lastSeq: -1 });
  ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => {
    m.startedAt = performance.now();
    const options = { size: $("size").value, codec: $("codec").value };
    ws.send(JSON.stringify({ type: "start", version: 1, pipeline: $("pipeline").value, options }));
  };
  ws.onmessage = (ev) => (typeof ev.data === "string" ? onControl(JSON.parse(ev.data)) : onMedia(ev.data));
  ws.onclose = (ev) => { log(`closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`); teardown(); };
  ws.onerror = () => log("WebSocket error (is the server running? token?)", "err");
  setButtons(true);
}

function stop() {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "stop" }));
  stopMic();
}

function teardown() {
  stopMic();
  if (player) { player.close(); player = null; }
  if (decoder && decoder.state !== "closed") decoder.close();
  decoder = null; ws = null; session = null;
  setButtons(false);
}

function setButtons(running) {
  $("start").disabled = running;
  $("stop").disabled = $("interrupt").disabled = !running;
}

async function onControl(msg) {
  if (msg.type === "ready") {
    session = msg;
    const v = msg.video;
    view.width = v.width; view.height = v.height;
    log(`session ${msg.session}: ${msg.pipeline}, ${v.codec} ${v.width}x${v.height} @ ${v.fps} fps`);
    if (msg.audio_in) await startMic().catch((e) => { log(`microphone: ${e.message}`, "err"); stop(); });
  } else if (msg.type === "stats") {
    m.stats = msg;
  } else if (msg.type === "error") {
    log(`error ${msg.code}: ${msg.message}`, "err");
  } else if (msg.type === "ended") {
    log(`ended: ${msg.reason}`);
  }
}

function onMedia(buf) {
  const h = parseHeader(buf);
  if (h.kind === KIND.PCM16) { if ($("play").checked) playAudio(h); return; }
  if (m.lastSeq >= 0 && h.seq > m.lastSeq + 1) m.drops += h.seq - m.lastSeq - 1;
  m.lastSeq = h.seq;
  const shown = () => {
    const t = performance.now();
    if (m.firstFrame === null) m.firstFrame = t - m.startedAt;
    push(m.frames, t, 60);
    if (h.flags & FLAG.CLIENT_CLOCK) push(m.g2g, t - Number(h.captureNs) / 1e6, 200);
    push(m.server, (h.graphUs + h.sendWaitUs) / 1000, 200);
  };
  if (h.kind === KIND.JPEG) {
    createImageBitmap(new Blob([h.payload], { type: "image/jpeg" })).then((bmp) => {
      g.drawImage(bmp, 0, 0, view.width, view.height); bmp.close(); shown();
    });
  } else if (h.kind === KIND.H264) {
    decodeH264(h, shown);
  }
}

function push(list, v, n) { list.push(v); if (list.length > n) list.shift(); }

// ---- H.264 through WebCodecs -------------------------------------------------------------------------
function codecString(annexB) {
  for (let i = 0; i + 7 < annexB.length; i++) {  // find the SPS (NAL type 7) after a start code
    if (annexB[i] === 0 && annexB[i + 1] === 0 && annexB[i + 2] === 1 && (annexB[i + 3] & 0x1f) === 7) {
      const hex = (b) => b.toString(16).padStart(2, "0");
      return `avc1.${hex(annexB[i + 4])}${hex(annexB[i + 5])}${hex(annexB[i + 6])}`;
    }
  }
  return "avc1.42E01F";
}

function decodeH264(h, shown) {
  if (!("VideoDecoder" in window)) { log("this browser has no WebCodecs: choose jpeg", "err"); stop(); return; }
  if (!decoder) {
    if (!(h.flags & FLAG.KEYFRAME)) return;  // wait for a key frame
    decoder = new VideoDecoder({
      output: (frame) => { g.drawImage(frame, 0, 0, view.width, view.height); frame.close(); decoder.pending.shift()(); },
      error: (e) => { log(`H.264 decoder: ${e.message}`, "err"); decoder = null; },
    });
    decoder.pending = [];
    decoder.configure({ codec: codecString(h.payload), optimizeForLatency: true });
  }
  if (decoder.state !== "configured") return;
  decoder.pending.push(shown);
  decoder.decode(new EncodedVideoChunk({ type: h.flags & FLAG.KEYFRAME ? "key" : "delta",
                                         timestamp: Math.round(h.pts / 48), data: h.payload }));
}

// ---- microphone → server ---------------------------------------------------------------------------
async function startMic() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
  });
  const ctx = new AudioContext({ latencyHint: "interactive" });
  await ctx.audioWorklet.addModule("pcm-worklet.js");
  const node = new AudioWorkletNode(ctx, "pcm-chunker");
  const source = ctx.createMediaStreamSource(stream);
  source.connect(node);
  let seq = 0;
  node.port.onmessage = (ev) => {
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    const pcm = new Uint8Array(ev.data);
    const msg = new Uint8Array(HEADER_BYTES + pcm.length);
    msg.set(packHeader(KIND.PCM16, seq, seq * 320 * 3, nowNs(), pcm.length));
    msg.set(pcm, HEADER_BYTES);
    ws.send(msg);
    seq++;
  };
  mic = { stream, ctx };
  log(`microphone at ${ctx.sampleRate} Hz → 16 kHz PCM16`);
}

function stopMic() {
  if (!mic) return;
  mic.stream.getTracks().forEach((t) => t.stop());
  mic.ctx.close();
  mic = null;
}

// ---- returned audio, scheduled by pts ----------------------------------------------------------------
function playAudio(h) {
  if (!player) { player = new AudioContext({ latencyHint: "interactive" }); player.base = null; }
  const n = h.payload.byteLength / 2;
  const pcm = new Int16Array(h.payload.buffer.slice(h.payload.byteOffset, h.payload.byteOffset + n * 2));
  const buffer = player.createBuffer(1, n, 16000);
  const ch = buffer.getChannelData(0);
  for (let i = 0; i < n; i++) ch[i] = pcm[i] / 32768;
  let at = player.base === null ? null : player.base + h.pts / 48000;
  if (at === null || at < player.currentTime || h.flags & (FLAG.INTERRUPTED | FLAG.DISCONTINUITY)) {
    player.base = player.currentTime + 0.06 - h.pts / 48000;  // 60 ms jitter buffer
    at = player.base + h.pts / 48000;
  }
  const src = player.createBufferSource();
  src.buffer = buffer;
  src.connect(player.destination);
  src.start(at);
}

// ---- readout ---------------------------------------------------------------------------------------
function pct(list, p) {
  if (!list.length) return NaN;
  const s = [...list].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

setInterval(() => {
  if (!session) { return; }
  const f = m.frames, span = f.length > 1 ? (f[f.length - 1] - f[0]) / 1000 : 0;
  const fps = span > 0 ? (f.length - 1) / span : 0;
  const s = m.stats, d = s ? s.dropped : null;
  $("readout").textContent = [
    `${session.pipeline}  ${session.video.codec} ${session.video.width}x${session.video.height}`,
    `fps           ${fps.toFixed(1)}`,
    `first frame   ${m.firstFrame === null ? "-" : m.firstFrame.toFixed(0) + " ms"}`,
    `glass→glass   p50 ${pct(m.g2g, 0.5).toFixed(1)}  p95 ${pct(m.g2g, 0.95).toFixed(1)} ms`,
    `server        p50 ${pct(m.server, 0.5).toFixed(1)}  p95 ${pct(m.server, 0.95).toFixed(1)} ms`,
    `dropped       ${m.drops} seen` + (d ? `, server: ${d.video} video ${d.audio} audio ${d.source} source` : ""),
  ].join("\n");
}, 250);

// ---- controls --------------------------------------------------------------------------------------
$("start").onclick = start;
$("stop").onclick = stop;
$("interrupt").onclick = () => ws && ws.send(JSON.stringify({ type: "interrupt" }));
$("pipeline").onchange = () => { $("play").checked = $("pipeline").value !== "scope"; };
fetch("pipelines").then((r) => r.json()).then((list) => {
  const sel = $("pipeline"), current = sel.value;
  sel.innerHTML = "";
  for (const [name, help] of Object.entries(list)) {
    const o = document.createElement("option");
    o.value = o.textContent = name; o.title = help;
    sel.appendChild(o);
  }
  if (list[current]) sel.value = current;
}).catch(() => {});
$("play").checked = $("pipeline").value !== "scope";
log("ready: Start streams your microphone (scope) or shows the test card; the page never records.");
