// framegraph live page: microphone → server over a WebSocket (protocol: apps/PROTOCOL.md, version 1)
// → live canvas, with glass-to-glass latency, FPS and drops. JPEG frames are decoded with
// createImageBitmap; H.264 (Annex-B) with WebCodecs where the browser has it. Pipelines that take
// camera poses (`ready.pose_in`, e.g. `scene`) get an orbit viewer: drag on the picture to turn the
// camera around its target, wheel to zoom; each move sends a `pose`.
//
// Latency, all on this page's clock (performance.now()): each microphone chunk is stamped with the
// capture time of its last sample (the AudioContext time of that sample mapped to performance time,
// minus the input latency the browser reports for the track); the server echoes the capture time of
// the audio behind each frame in the header (`capture_ns`, flag CLIENT_CLOCK); a frame counts as
// presented at the first animation frame after it was drawn. Glass-to-glass = presented − captured.
// `window.fg.stats()` returns the numbers the readout shows (tests read it).
//
// Transport: WebRTC by default (webrtc.js: the offer at /webrtc/offer, control on a data channel, H.264 or VP8
// and Opus on RTP tracks, the microphone as an audio track), the WebSocket when the peer connection is not up
// within 5 s or the server has no WebRTC; `?transport=websocket` (or `webrtc`) forces one (the embedding player,
// player.html in the Gradio demo, too: its offer goes to the demo, which forwards it).
// The readout's first line says which transport is live. Over WebRTC the page cannot tell the server when its
// microphone's audio was captured, so no glass-to-glass is claimed there (the server's timings still show).
//
// Embedding (player.html, used by the Gradio demo in apps/demo): query parameters preset the session —
// `url` (absolute ws:// URL, or a path on this page's host such as `ws?tab=ID`), `pipeline`, `size`,
// `codec`, `options` (JSON object merged into the start options), `play` (1: play the returned audio),
// `poster` (an image drawn on the canvas when the page opens, until the first frame: the avatar's idle face) —
// and `window.fg` drives it from the embedding page: `start({mic})` (mic: false streams silence instead of
// the microphone, keeping an audio-clocked pipeline running), `stop()`, `interrupt()`, `config(options)`
// (live options, remembered and re-sent after each `ready`), `prepare()` (inside a click: unlocks audio
// and starts a session without the microphone when none runs) and `feed(url)` (fetch 16 kHz PCM16 and
// stream it in real time, stamped like microphone audio; the microphone is muted while a clip plays).
"use strict";

const HEADER_BYTES = 48;
const KIND = { JPEG: 1, H264: 2, PCM16: 3, PNG: 4, WEBP: 5 };
const IMAGE_TYPES = { 1: "image/jpeg", 4: "image/png", 5: "image/webp" };  // pictures decoded one by one
const FLAG = { KEYFRAME: 1, DISCONTINUITY: 2, INTERRUPTED: 4, CLIENT_CLOCK: 8 };
const $ = (id) => document.getElementById(id);

const params = new URLSearchParams(location.search);
const defaultUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host || "127.0.0.1:8765"}/ws`;
$("url").value = wsUrl(params.get("url")) || defaultUrl;
for (const key of ["pipeline", "size", "codec"]) presetSelect(key, params.get(key));
const startOptions = parseOptions(params.get("options"));

// A path ("/fg/ws?tab=1", or "ws?tab=1" relative to this page) becomes a WebSocket URL on this page's host.
function wsUrl(value) {
  if (!value || /^wss?:/i.test(value)) return value;
  const u = new URL(value, location.href);
  u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  return u.href;
}

function presetSelect(id, value) {
  const el = $(id);
  if (!value || !el) return;
  if (el.tagName === "SELECT" && ![...el.options].some((o) => o.value === value)) el.add(new Option(value, value));
  el.value = value;
}

function parseOptions(text) {
  if (!text) return {};
  try { const o = JSON.parse(text); return o && typeof o === "object" && !Array.isArray(o) ? o : {}; }
  catch (e) { return {}; }
}

let ws = null, mic = null, decoder = null, audio = null, session = null;
let live = null;  // the transport in use: "webrtc" or "websocket"
const wantTransport = params.get("transport") || document.body.dataset.transport || "webrtc";
const view = $("view"), g = view.getContext("2d");
const m = {};
const playback = { base: null };

function resetMeasures() {
  Object.assign(m, { presentedAt: [], g2g: [], server: [], inputMs: [], drops: 0, skipped: 0, presented: 0,
                     received: 0, firstFrame: null, startedAt: performance.now(), stats: null, lastSeq: -1,
                     lastQueuedSeq: -1, audioOut: 0, ended: null, closed: null, errors: [], fedChunks: 0,
                     clips: 0, configs: 0, sentOn: 0 });
}
resetMeasures();

function log(text, cls) {
  const line = document.createElement("div");
  line.textContent = `${new Date().toLocaleTimeString()}  ${text}`;
  if (cls) line.className = cls;
  $("log").prepend(line);
}

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
let useMic = true;  // false: the session gets silence (and fed clips) instead of the microphone
const liveConfig = {};  // live options set through fg.config, re-sent after every ready

let placing = false;  // asking a cluster's front door where to connect (see placed())

// A cluster's front door (framegraph cluster) names the replica to connect to at /place; a single server
// answers {"url": null} there (connect to it directly; older servers: 404). Null (and a message) when the
// cluster is full.
async function placed(url) {
  const place = new URL("/place", url);
  place.protocol = url.protocol === "wss:" ? "https:" : "http:";
  place.search = url.search;
  let r;
  try {
    r = await fetch(place, { cache: "no-store" });
  } catch (e) {
    return url;  // not reachable over HTTP from this page: try the WebSocket itself
  }
  const json = (r.headers.get("content-type") || "").startsWith("application/json");
  if (r.ok && json) {
    const where = (await r.json()).url;
    return where ? new URL(where) : url;
  }
  if (r.ok || r.status === 404) return url;  // not a front door
  log(`cannot start: ${(await r.text()).trim()} (HTTP ${r.status})`, "err");
  return null;
}

async function start(opts = {}) {
  if (ws || placing) return;
  const target = new URL($("url").value);
  if (params.get("token")) target.searchParams.set("token", params.get("token"));
  // The AudioContext is made (or resumed) here, inside the click: browsers keep one made later suspended.
  if (!audio) audio = new AudioContext({ latencyHint: "interactive" });
  audio.resume().catch(() => {});
  // Measures are reset before the wait for /place: a clip fed while it runs (feedUrl) is counted after this.
  useMic = opts.mic !== false;
  resetMeasures();
  placing = true;
  let url;
  try {
    url = await placed(target);
  } finally {
    placing = false;
  }
  if (!url || ws) return;
  await connectTo(url, url !== target, 0);
}

// A full cluster replica names another one in its `full` error (`url`): the session starts there, at most this
// many times over.
const MAX_SENT_ON = 3;

async function connectTo(url, placedElsewhere, sentOn) {
  playback.base = null;
  orbit.on = false;
  view.classList.remove("orbit");
  // Placed by a cluster's front door: the replica is another origin, whose offer endpoint a page may not read
  // (no CORS there yet), and a refused try would spend the placement's one-use ticket: the WebSocket then.
  if (wantTransport === "webrtc" && !placedElsewhere && window.fgRtc && window.RTCPeerConnection &&
      await startRtc(url)) return;
  if (wantTransport === "webrtc" && placedElsewhere) log("placed on a cluster replica: over the WebSocket");
  live = "websocket";
  const link = ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => {
    const options = sessionOptions();
    if ($("codec").value) options.codec = $("codec").value;
    ws.send(JSON.stringify({ type: "start", version: 1, pipeline: $("pipeline").value, options }));
  };
  ws.onmessage = (ev) => (typeof ev.data === "string" ? onControl(JSON.parse(ev.data)) : onMedia(ev.data));
  ws.onclose = (ev) => {
    m.closed = ev.code;
    log(`closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`, ev.code === 1000 ? undefined : "err");
    teardown();
    if (!link.sentOnTo || link.stopped) return;
    if (sentOn >= MAX_SENT_ON) { log(`full replicas sent the session on ${sentOn + 1} times; try again later`, "err"); return; }
    log(`full there; the session goes on to ${link.sentOnTo}`);
    Object.assign(m, { sentOn: sentOn + 1, ended: null, closed: null });  // the refused try was not the session
    connectTo(new URL(link.sentOnTo), true, sentOn + 1);
  };
  ws.onerror = () => log("WebSocket error (is the server running? token?)", "err");
  setButtons(true);
}

// The session over WebRTC (webrtc.js). True when it runs (or was refused: the refusal is logged); false when
// WebRTC is not to be had here, so the caller falls back to the WebSocket.
async function startRtc(url) {
  placing = true;
  setButtons(true);
  try {
    ws = await window.fgRtc.connect(url, $("pipeline").value, sessionOptions(), audio, {
      onControl,
      onClose: (code, reason) => {
        m.closed = code;
        log(`closed (${code}${reason ? " " + reason : ""})`, code === 1000 ? undefined : "err");
        teardown();
      },
    });
  } catch (e) {
    ws = null;
    setButtons(false);
    if (e instanceof window.fgRtc.Refused) { log(`cannot start: ${e.message}`, "err"); return true; }
    log(`WebRTC: ${e.message}; using the WebSocket`, "err");
    return false;
  } finally {
    placing = false;
  }
  live = "webrtc";
  ws.rtc = true;
  log(`WebRTC connected (${ws.codec} + Opus)`);
  drawRtcFrames(ws);
  return true;
}

// Each picture the <video> element presents is drawn on the canvas (the page's own presenting path), with
// the server's timing of that frame (its `frame` message, found by RTP timestamp).
function drawRtcFrames(link) {
  let seq = 0;
  const video = link.video;
  const onFrame = (now, meta) => {
    if (ws !== link) return;
    const f = link.frameInfo(meta.rtpTimestamp);
    const h = f ? { seq: f.seq, flags: f.flags, captureNs: BigInt(f.capture_ns), graphUs: f.graph_us, sendWaitUs: f.send_wait_us }
                : { seq: seq, flags: 0, captureNs: 0n, graphUs: 0, sendWaitUs: 0 };
    seq = h.seq + 1;
    m.received++;
    if (m.lastSeq >= 0 && h.seq > m.lastSeq + 1) m.drops += h.seq - m.lastSeq - 1;
    m.lastSeq = h.seq;
    createImageBitmap(video).then((bmp) => queueFrame(bmp, h), () => {});
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
  const poll = setInterval(async () => {
    if (ws !== link) { clearInterval(poll); return; }
    video.muted = !$("play").checked;
    (await link.pc_stats()).forEach((r) => { if (r.type === "inbound-rtp" && r.kind === "audio") m.audioOut = r.packetsReceived; });
  }, 500);
}

function sessionOptions() {
  const options = {};
  if ($("size").value) options.size = $("size").value;
  if ($("codec").value && wantTransport !== "webrtc") options.codec = $("codec").value;
  return Object.assign(options, startOptions, cameraOptions());
}

function stop() {
  if (ws) ws.stopped = true;  // a refused try is not followed elsewhere once the user stopped
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "stop" }));
  stopMic();
  stopPump();
  if (window.fgCamera) window.fgCamera.stop();
}

function teardown() {
  stopMic();
  stopPump();
  if (window.fgCamera) window.fgCamera.stop();
  if (decoder && decoder.state !== "closed") decoder.close();
  decoder = null; ws = null; session = null; live = null;
  orbit.drag = null;
  setButtons(false);
  setTimeout(() => { if (!ws && audio) audio.suspend(); }, 500);  // idle: no audio thread running
}

function setButtons(running) {
  $("start").disabled = running;
  $("stop").disabled = $("interrupt").disabled = !running;
}

async function onControl(msg) {
  if (msg.type === "ready") {
    session = msg;
    const v = msg.video;
    if (view.width !== v.width || view.height !== v.height) { view.width = v.width; view.height = v.height; }  // (clears it)
    log(`session ${msg.session}: ${msg.pipeline}, ${v.codec} ${v.width}x${v.height} @ ${v.fps} fps`);
    if (msg.pose_in) startOrbit(msg.camera);
    if (Object.keys(liveConfig).length) sendConfig();
    if (msg.video_in && ws.camera) log(`camera ${ws.camera.stats().width}x${ws.camera.stats().height} → the WebRTC video track`);
    else if (msg.video_in && window.fgCamera) window.fgCamera.start(ws, msg.video_in, log).catch((e) => { log(`camera: ${e.message}`, "err"); stop(); });
    if (msg.audio_in) startPump();
    if (msg.audio_in && useMic) await startMic().catch((e) => { log(`microphone: ${e.message}`, "err"); stop(); });
  } else if (msg.type === "stats") {
    m.stats = msg;
  } else if (msg.type === "error" && msg.code === "full" && msg.url && ws && !ws.rtc) {
    ws.sentOnTo = msg.url;  // not an error the user sees: the session starts there once this socket closes
    log(`full here: ${msg.message}`);
  } else if (msg.type === "error") {
    m.errors.push(msg);
    log(`error ${msg.code}: ${msg.message}`, "err");
  } else if (msg.type === "ended") {
    m.ended = msg.reason;
    log(`ended: ${msg.reason}`);
  }
}

function onMedia(buf) {
  const h = parseHeader(buf);
  if (h.kind === KIND.PCM16) { m.audioOut++; if ($("play").checked) playAudio(h); return; }
  m.received++;
  if (m.lastSeq >= 0 && h.seq > m.lastSeq + 1) m.drops += h.seq - m.lastSeq - 1;
  m.lastSeq = h.seq;
  if (IMAGE_TYPES[h.kind]) {  // JPEG, or PNG / WebP with alpha (drawn over the page's background)
    createImageBitmap(new Blob([h.payload], { type: IMAGE_TYPES[h.kind] })).then((bmp) => queueFrame(bmp, h),
      (e) => log(`${IMAGE_TYPES[h.kind]} frame ${h.seq}: ${e.message}`, "err"));
  } else if (h.kind === KIND.H264) {
    decodeH264(h);
  }
}

function push(list, v, n) { list.push(v); if (list.length > n) list.shift(); }

// ---- presenting: newest decoded picture drawn at the next animation frame ----------------------------
// A frame drawn in one animation frame is on screen by the next one; that is when it counts as shown.
const present = { pending: null, drawn: null, raf: 0 };

function queueFrame(image, h) {
  if (h.seq <= m.lastQueuedSeq) { image.close(); m.skipped++; return; }  // decoded out of order: stale
  m.lastQueuedSeq = h.seq;
  if (present.pending) { present.pending.image.close(); m.skipped++; }  // never shown: a newer one came
  present.pending = { image, h };
  if (!present.raf) present.raf = requestAnimationFrame(onAnimationFrame);
}

function onAnimationFrame(ts) {
  present.raf = 0;
  const now = performance.now();
  if (present.drawn) { presented(present.drawn, Math.max(ts, present.drawn.drawnAt)); present.drawn = null; }
  const p = present.pending;
  if (!p) return;
  present.pending = null;
  if (p.h.kind !== KIND.JPEG) g.clearRect(0, 0, view.width, view.height);  // pictures with alpha: the page shows through
  g.drawImage(p.image, 0, 0, view.width, view.height);
  p.image.close();
  present.drawn = { h: p.h, drawnAt: now };
  present.raf = requestAnimationFrame(onAnimationFrame);  // the next one tells when it was shown
}

function presented({ h }, t) {
  m.presented++;
  if (m.firstFrame === null) m.firstFrame = t - m.startedAt;
  push(m.presentedAt, t, 60);
  if (h.flags & FLAG.CLIENT_CLOCK) push(m.g2g, t - Number(h.captureNs) / 1e6, 200);
  push(m.server, (h.graphUs + h.sendWaitUs) / 1000, 200);
}

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

function decodeH264(h) {
  if (!("VideoDecoder" in window)) { log("this browser has no WebCodecs: choose jpeg", "err"); stop(); return; }
  if (!decoder) {
    if (!(h.flags & FLAG.KEYFRAME)) return;  // wait for a key frame
    const headers = new Map();  // chunk timestamp → media header
    decoder = new VideoDecoder({
      output: (frame) => {
        const fh = headers.get(frame.timestamp);
        headers.delete(frame.timestamp);
        if (fh) queueFrame(frame, fh); else frame.close();
      },
      error: (e) => {
        log(`H.264 decoder: ${e.message}`, "err");
        decoder = null;
        if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "config", options: { keyframe: true } }));
      },
    });
    decoder.headers = headers;
    decoder.configure({ codec: codecString(h.payload), optimizeForLatency: true });
  }
  if (decoder.state !== "configured") return;
  const timestamp = Math.round(h.pts * 1e6 / 48000);  // µs
  decoder.headers.set(timestamp, h);
  decoder.decode(new EncodedVideoChunk({ type: h.flags & FLAG.KEYFRAME ? "key" : "delta", timestamp, data: h.payload }));
}

// ---- microphone → server ---------------------------------------------------------------------------
async function startMic() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
  });
  if (!ws) { stream.getTracks().forEach((t) => t.stop()); return; }  // the session ended meanwhile
  if (ws.rtc) {  // WebRTC: the microphone goes as the audio track (Opus), no PCM16 messages
    ws.setMic(stream);
    mic = { stream, source: { disconnect() { if (ws && ws.rtc) ws.setMic(null); } }, node: { port: {}, disconnect() {} } };
    log("microphone → the WebRTC audio track (Opus)");
    return;
  }
  await audio.audioWorklet.addModule("pcm-worklet.js");
  const node = new AudioWorkletNode(audio, "pcm-chunker");
  const source = audio.createMediaStreamSource(stream);
  source.connect(node);
  const track = stream.getAudioTracks()[0];
  let seq = 0;
  node.port.onmessage = (ev) => {
    if (!ws || ws.readyState !== WebSocket.OPEN || feeding()) return;  // a fed clip has the floor
    const pcm = new Uint8Array(ev.data.pcm);
    const msg = new Uint8Array(HEADER_BYTES + pcm.length);
    const captured = captureTime(ev.data.t, track);
    msg.set(packHeader(KIND.PCM16, seq, seq * 320 * 3, BigInt(Math.round(captured * 1e6)), pcm.length));
    msg.set(pcm, HEADER_BYTES);
    ws.send(msg);
    seq++;
  };
  mic = { stream, source, node };
  log(`microphone at ${audio.sampleRate} Hz → 16 kHz PCM16`);
}

// performance.now() time (ms) at which the sample the AudioContext handled at context time `t` was
// captured. getOutputTimestamp() pairs the context time being heard now with performance time; a
// sample is rendered the output latency before it is heard. Never later than now (it has arrived),
// then minus the input latency the browser reports for the track (device → track).
function captureTime(t, track) {
  const now = performance.now();
  let rendered = now;
  const ts = audio.getOutputTimestamp ? audio.getOutputTimestamp() : null;
  if (ts && ts.performanceTime > 0) {
    const lead = (audio.outputLatency || 0) + (audio.baseLatency || 0);
    rendered = Math.min(now, ts.performanceTime + (t - ts.contextTime - lead) * 1000);
  }
  let input = 0;
  const stats = track.stats;  // MediaStreamTrackAudioStats where available
  if (stats && Number.isFinite(stats.latency)) input = stats.latency * 1000;
  else if (track.getSettings().latency > 0) input = track.getSettings().latency * 1000;
  push(m.inputMs, input, 50);
  return rendered - input;
}

function stopMic() {
  if (!mic) return;
  mic.stream.getTracks().forEach((t) => t.stop());
  mic.source.disconnect();
  mic.node.port.onmessage = null;
  mic.node.disconnect();
  mic = null;
}

// ---- fed audio: clips (typed text, files) and silence, paced in real time ------------------------------
// 20 ms chunks sent on a 10 ms timer at their real-time due moment; each is stamped with that moment as
// its capture time (the clock a microphone would give it), so glass-to-glass covers fed speech too.
// Without the microphone, silence keeps an audio-clocked pipeline's picture moving between clips.
const CHUNK = 320;
const feed = { clips: [], clip: null, pos: 0, t0: 0, sent: 0, timer: 0, seq: 0 };

function feeding() { return feed.clip !== null || feed.clips.length > 0; }

// At `ready`: clips queued while the session was starting (a first Speak fetches its clip before the
// server is ready) are kept and spoken first.
function startPump() {
  if (feed.timer) clearInterval(feed.timer);
  Object.assign(feed, { t0: performance.now(), sent: 0, seq: 0 });
  feed.timer = setInterval(pump, 10);
}

function stopPump() {
  if (feed.timer) clearInterval(feed.timer);
  Object.assign(feed, { timer: 0, clips: [], clip: null, pos: 0 });
}

function nextChunk() {
  if (!feed.clip && feed.clips.length) { feed.clip = feed.clips.shift(); feed.pos = 0; }
  if (feed.clip) {
    const chunk = new Int16Array(CHUNK);
    chunk.set(feed.clip.subarray(feed.pos, feed.pos + CHUNK));
    feed.pos += CHUNK;
    if (feed.pos >= feed.clip.length) feed.clip = null;
    m.fedChunks++;
    return chunk;
  }
  return useMic ? null : new Int16Array(CHUNK);  // the microphone speaks, or silence
}

function pump() {
  if (!ws || ws.readyState !== WebSocket.OPEN || !session) return;
  const now = performance.now();
  let due = Math.floor((now - feed.t0) / 20);
  if (due - feed.sent > 10) {  // timers were throttled (hidden tab): skip the gap rather than burst it
    feed.t0 = now - 20 * feed.sent;
    due = feed.sent;
  }
  while (feed.sent < due) {
    feed.sent++;
    const chunk = nextChunk();
    if (!chunk) continue;
    if (ws.rtc) { playInto(ws.input, chunk); continue; }  // WebRTC: into the audio track, at its due time
    const pcm = new Uint8Array(chunk.buffer);
    const msg = new Uint8Array(HEADER_BYTES + pcm.length);
    const captured = feed.t0 + feed.sent * 20;
    msg.set(packHeader(KIND.PCM16, feed.seq, feed.seq * CHUNK * 3, BigInt(Math.round(captured * 1e6)), pcm.length));
    msg.set(pcm, HEADER_BYTES);
    ws.send(msg);
    feed.seq++;
  }
}

// A fed 20 ms chunk into the WebRTC audio track: scheduled back to back on the AudioContext (silence between
// clips is the track's own).
function playInto(node, chunk) {
  const buffer = audio.createBuffer(1, chunk.length, 16000);
  const ch = buffer.getChannelData(0);
  for (let i = 0; i < chunk.length; i++) ch[i] = chunk[i] / 32768;
  const src = audio.createBufferSource();
  src.buffer = buffer;
  src.connect(node);
  feed.rtcAt = Math.max(feed.rtcAt || 0, audio.currentTime + 0.02);
  src.start(feed.rtcAt);
  feed.rtcAt += chunk.length / 16000;
}

// The embedding page's click handler calls this: audio is unlocked inside the user's gesture, and a
// session without the microphone starts if none runs.
function prepare() {
  if (!audio) audio = new AudioContext({ latencyHint: "interactive" });
  audio.resume().catch(() => {});
  if (!ws) start({ mic: false });
}

// Fetch raw 16 kHz mono PCM16 (little-endian) and queue it for the session (starting one if needed).
async function feedUrl(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  const pcm = new Int16Array(await r.arrayBuffer());
  if (!ws) start({ mic: false });
  feed.clips.push(pcm);
  m.clips++;
  $("play").checked = true;  // a clip is meant to be heard, in sync with the picture
  log(`speaking a clip of ${(pcm.length / 16000).toFixed(2)} s`);
}

function interrupt() {
  feed.clips = []; feed.clip = null;  // barge-in: what was still to be said is dropped
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "interrupt" }));
}

function sendConfig() {
  if (!ws || ws.readyState !== WebSocket.OPEN || !session) return;
  ws.send(JSON.stringify({ type: "config", options: liveConfig }));
  m.configs++;
}

function config(options) {
  Object.assign(liveConfig, options);
  sendConfig();
}

// ---- returned audio, scheduled by pts ----------------------------------------------------------------
function playAudio(h) {
  if (!audio) return;
  const n = h.payload.byteLength / 2;
  const pcm = new Int16Array(h.payload.buffer.slice(h.payload.byteOffset, h.payload.byteOffset + n * 2));
  const buffer = audio.createBuffer(1, n, 16000);
  const ch = buffer.getChannelData(0);
  for (let i = 0; i < n; i++) ch[i] = pcm[i] / 32768;
  let at = playback.base === null ? null : playback.base + h.pts / 48000;
  if (at === null || at < audio.currentTime || h.flags & (FLAG.INTERRUPTED | FLAG.DISCONTINUITY)) {
    playback.base = audio.currentTime + 0.06 - h.pts / 48000;  // 60 ms jitter buffer
    at = playback.base + h.pts / 48000;
  }
  const src = audio.createBufferSource();
  src.buffer = buffer;
  src.connect(audio.destination);
  src.start(at);
}

// ---- orbit viewer: drag turns the camera around its target, wheel zooms ------------------------------
const orbit = { on: false, target: [0, 0, 0], up: [0, 0, 1], distance: 3, az: 0, el: 20, drag: null, raf: 0,
                sent: 0, last: null };

function startOrbit(camera) {
  const c = camera || {};
  Object.assign(orbit, { on: true, target: c.target || [0, 0, 0], up: c.up || [0, 0, 1], distance: c.distance || 3,
                         az: c.azimuth_deg || 0, el: c.elevation_deg ?? 20, drag: null, sent: 0, last: null });
  orbit.last = orbitPose();
  view.classList.add("orbit");
  log("drag on the picture to orbit the camera, wheel to zoom");
}

const sub = (a, b) => a.map((x, i) => x - b[i]);
const dot = (a, b) => a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
const unit = (a) => { const n = Math.hypot(...a); return a.map((x) => x / n); };

// World-to-camera 4×4 (OpenCV: x right, y down, z forward), rows, as renderers/cameras.py look_at.
function orbitPose() {
  const up = unit(orbit.up);
  let helper = [1, 0, 0];
  if (Math.abs(dot(helper, up)) > 0.9) helper = [0, 1, 0];
  const a = unit(cross(up, helper)), b = cross(up, a);  // the orbit plane, as orbit_path builds it
  const az = orbit.az * Math.PI / 180, el = orbit.el * Math.PI / 180;
  const eye = orbit.target.map((t, i) => t + orbit.distance * (Math.cos(el) * (Math.cos(az) * a[i] + Math.sin(az) * b[i])
                                                               + Math.sin(el) * up[i]));
  const fwd = unit(sub(orbit.target, eye)), right = unit(cross(fwd, up)), down = cross(fwd, right);
  const row = (r) => [...r, -dot(r, eye)];
  return [row(right), row(down), row(fwd), [0, 0, 0, 1]];
}

function sendPose() {
  orbit.raf = 0;
  if (!orbit.on || !ws || ws.readyState !== WebSocket.OPEN) return;
  orbit.last = orbitPose();
  ws.send(JSON.stringify({ type: "pose", matrix: orbit.last }));
  orbit.sent++;
}

function queuePose() { if (!orbit.raf) orbit.raf = requestAnimationFrame(sendPose); }  // at most one per frame

view.addEventListener("pointerdown", (e) => {
  if (!orbit.on) return;
  view.setPointerCapture(e.pointerId);
  orbit.drag = { x: e.clientX, y: e.clientY, az: orbit.az, el: orbit.el };
  e.preventDefault();
});
view.addEventListener("pointermove", (e) => {
  const d = orbit.drag;
  if (!orbit.on || !d) return;
  const degPerPx = 180 / view.clientWidth;  // a drag across the picture turns half way round
  orbit.az = d.az - (e.clientX - d.x) * degPerPx;  // the scene follows the pointer
  orbit.el = Math.max(-85, Math.min(85, d.el + (e.clientY - d.y) * degPerPx));
  queuePose();
});
for (const type of ["pointerup", "pointercancel"]) view.addEventListener(type, () => { orbit.drag = null; });
view.addEventListener("wheel", (e) => {
  if (!orbit.on) return;
  e.preventDefault();
  orbit.distance = Math.max(1e-3, orbit.distance * Math.exp(e.deltaY * 0.001));
  queuePose();
}, { passive: false });

// ---- readout ---------------------------------------------------------------------------------------
function pct(list, p) {
  if (!list.length) return NaN;
  const s = [...list].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

function fps() {
  const f = m.presentedAt, span = f.length > 1 ? (f[f.length - 1] - f[0]) / 1000 : 0;
  return span > 0 ? (f.length - 1) / span : 0;
}

function stats() {
  return {
    running: session !== null, ready: session, transport: live, rtc_codec: ws && ws.rtc ? ws.codec : null,
    rtc_video_delay_ms: ws && ws.rtc ? ws.videoDelayMs : null, pipeline: session && session.pipeline, video: session && session.video,
    received: m.received, presented: m.presented, skipped: m.skipped, drops_seen: m.drops, fps: fps(),
    first_frame_ms: m.firstFrame, audio_out: m.audioOut,
    g2g_ms: { n: m.g2g.length, p50: pct(m.g2g, 0.5), p95: pct(m.g2g, 0.95), max: m.g2g.length ? Math.max(...m.g2g) : NaN },
    input_latency_ms: pct(m.inputMs, 0.5),
    server_ms: { p50: pct(m.server, 0.5), p95: pct(m.server, 0.95) },
    poses_sent: orbit.sent, pose: orbit.on ? orbit.last : null, orbit: orbit.on ? { az: orbit.az, el: orbit.el, distance: orbit.distance } : null,
    server_stats: m.stats, ended: m.ended, closed: m.closed, errors: m.errors, sent_on: m.sentOn,
    mic: useMic, feeding: feeding(), fed_chunks: m.fedChunks, clips: m.clips, configs_sent: m.configs,
    poster: posterShown, camera: ws && ws.camera ? ws.camera.stats() : window.fgCamera ? window.fgCamera.stats() : null,
  };
}

window.fg = {
  stats, start, stop, interrupt, config, prepare,
  record: (ms) => (ws && ws.rtc ? ws.record(ms) : Promise.reject(new Error("recording needs the WebRTC transport"))),
  feed: (url) => feedUrl(url).catch((e) => log(`clip: ${e.message}`, "err")),
};

setInterval(() => {
  if (!session) { return; }
  const s = m.stats, d = s ? s.dropped : null;
  const lines = [
    `${session.pipeline}  ${live === "webrtc" ? ws.codec : session.video.codec} ${session.video.width}x${session.video.height}`,
    `transport     ${live}${live === "webrtc" ? " (RTP + data channel)" : ""}`,
    ...(live === "webrtc" && ws.videoDelayMs !== null ? [`lip sync      video held ${ws.videoDelayMs} ms for its sound`] : []),
    `fps           ${fps().toFixed(1)}`,
    `first frame   ${m.firstFrame === null ? "-" : m.firstFrame.toFixed(0) + " ms"}`,
  ];
  if (session.audio_in) {
    // no frame stamped with a capture time: "n/a" and why, never NaN
    const why = live === "webrtc" ? "not measured over WebRTC" : !useMic || feeding() ? "no microphone"
                                                                                         : "no frame measured yet";
    lines.push(m.g2g.length ? `glass→glass   p50 ${pct(m.g2g, 0.5).toFixed(1)}  p95 ${pct(m.g2g, 0.95).toFixed(1)} ms`
                            : `glass→glass   n/a — ${why}`,
               useMic && !feeding() ? `  mic input   ${pct(m.inputMs, 0.5).toFixed(1)} ms (browser-reported, included)`
                                    : `  audio in    ${feeding() ? "clip" : "silence"}, stamped when sent (no microphone)`);
  }
  lines.push(`server        p50 ${pct(m.server, 0.5).toFixed(1)}  p95 ${pct(m.server, 0.95).toFixed(1)} ms`,
             `dropped       ${m.drops} seen, ${m.skipped} not shown` +
             (d ? `, server: ${d.video} video ${d.audio} audio ${d.source} source` : ""));
  for (const w of (s && s.warnings) || []) lines.push(`warning       ${w}`);
  if (orbit.on) lines.push(`camera        az ${orbit.az.toFixed(0)}°  el ${orbit.el.toFixed(0)}°  ${orbit.sent} poses sent`);
  $("readout").textContent = lines.join("\n");
}, 250);

// ---- the poster: a still picture until the first frame ----------------------------------------------
let posterShown = false;
if (params.get("poster")) {
  const img = new Image();
  img.onload = () => {
    if (present.drawn || m.presented) return;  // a frame came first
    view.width = img.naturalWidth; view.height = img.naturalHeight;
    g.drawImage(img, 0, 0);
    posterShown = true;
  };
  img.onerror = () => log(`poster ${params.get("poster")}: not loaded`, "err");
  img.src = params.get("poster");
}

// ---- controls --------------------------------------------------------------------------------------
$("start").onclick = () => start({ mic: true });
$("stop").onclick = stop;
$("interrupt").onclick = interrupt;
// generate: the camera toggle (camera.js) asks for input "camera" at the chosen strength.
function cameraOptions() {
  return $("pipeline").value === "generate" && $("camera") && $("camera").checked
    ? { input: "camera", strength: Number($("strength").value) } : {};
}
function showCameraBox() { if ($("camera-box")) $("camera-box").hidden = $("pipeline").value !== "generate"; }

$("pipeline").addEventListener("change", showCameraBox);
$("pipeline").onchange = () => {
  $("play").checked = $("pipeline").value === "testcard";
  if ($("pipeline").value === "avatar") $("size").value = "";  // the avatar streams at its portrait's size
};
if ($("pipeline").tagName === "SELECT") fetch("pipelines").then((r) => r.json()).then((list) => {
  const sel = $("pipeline"), current = sel.value;
  sel.innerHTML = "";
  for (const [name, help] of Object.entries(list)) {
    const o = document.createElement("option");
    o.value = o.textContent = name; o.title = help;
    sel.appendChild(o);
  }
  if (list[current]) sel.value = current;
  showCameraBox();
}).catch((e) => log(`pipelines: ${e.message}`, "err"));
$("play").checked = params.has("play") ? params.get("play") === "1" : $("pipeline").value === "testcard";
showCameraBox();
log(document.body.dataset.greeting || "ready: Start streams your microphone (scope), shows the test card, or a scene to orbit; the page never records.");
