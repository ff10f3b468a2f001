// The browser's camera as a session's video input (ready.video_in, apps/PROTOCOL.md "Client → server camera
// pictures"): getUserMedia video → drawn on a canvas at video_in's size (aspect kept, black bars) → JPEG blobs,
// at most video_in.max_fps a second, over the session's WebSocket (48-byte header of kind JPEG, from app.js).
// A JPEG over video_in.max_bytes is not sent: the quality is lowered for the next picture instead.
// window.fgCamera: start(ws, videoIn, log) → Promise, stop(), stats().
"use strict";

window.fgCamera = (() => {
  const canvas = document.createElement("canvas"), ctx = canvas.getContext("2d");
  const video = document.createElement("video");
  video.muted = true;
  video.playsInline = true;
  let stream = null, timer = null, socket = null, busy = false;
  let quality = 0.8, sent = 0, oversize = 0, seq = 0, t0 = 0, lastBytes = 0;

  async function start(ws, videoIn, log) {
    stop();
    stream = await navigator.mediaDevices.getUserMedia({ video: { width: videoIn.width, height: videoIn.height } });
    if (ws.readyState !== WebSocket.OPEN) { stop(); return; }  // the session ended meanwhile
    socket = ws;
    video.srcObject = stream;
    await video.play();
    canvas.width = videoIn.width; canvas.height = videoIn.height;
    sent = oversize = seq = 0; quality = 0.8; t0 = performance.now();
    const periodMs = 1000 / videoIn.max_fps;
    timer = setInterval(() => grab(videoIn), periodMs * 1.05);  // a little under max_fps: timer jitter
    log(`camera ${video.videoWidth}x${video.videoHeight} → JPEG ${videoIn.width}x${videoIn.height} ` +
        `at ≤ ${videoIn.max_fps} fps`);
  }

  function grab(videoIn) {
    if (busy || !socket || socket.readyState !== WebSocket.OPEN || !video.videoWidth) return;
    const s = Math.min(canvas.width / video.videoWidth, canvas.height / video.videoHeight);
    const w = video.videoWidth * s, h = video.videoHeight * s;
    ctx.fillStyle = "#000";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(video, (canvas.width - w) / 2, (canvas.height - h) / 2, w, h);
    const captured = performance.now();
    busy = true;
    canvas.toBlob(async (blob) => {
      try {
        if (!blob || !socket || socket.readyState !== WebSocket.OPEN) return;
        lastBytes = blob.size;
        if (blob.size > videoIn.max_bytes) {  // too big to send: lower the quality for the next one
          oversize++;
          quality = Math.max(0.3, quality - 0.1);
          return;
        }
        const jpeg = new Uint8Array(await blob.arrayBuffer());
        const msg = new Uint8Array(HEADER_BYTES + jpeg.length);
        const pts = Math.round((captured - t0) * 48);  // ms → 48 kHz ticks
        msg.set(packHeader(KIND.JPEG, seq++, pts, BigInt(Math.round(captured * 1e6)), jpeg.length));
        msg.set(jpeg, HEADER_BYTES);
        socket.send(msg);
        sent++;
      } finally {
        busy = false;
      }
    }, "image/jpeg", quality);
  }

  function stop() {
    if (timer !== null) clearInterval(timer);
    timer = null; socket = null; busy = false;
    if (stream) stream.getTracks().forEach((t) => t.stop());
    stream = null;
    video.srcObject = null;
  }

  function stats() {
    return { on: timer !== null, sent, oversize, quality, last_bytes: lastBytes,
             width: video.videoWidth, height: video.videoHeight };
  }

  return { start, stop, stats, canvas };
})();
