// The page's WebRTC transport (apps/PROTOCOL.md, "WebRTC"): an RTCPeerConnection to POST /webrtc/offer,
// control messages on its data channel, video and Opus audio on its tracks, the microphone (and clips fed
// by the page) as an audio track. app.js uses it by default and falls back to the WebSocket when the peer
// connection is not up within CONNECT_MS (or the server has no WebRTC).
//
// window.fgRtc.connect(url, pipeline, options, hooks) → Promise of a link that looks like an open WebSocket
// to app.js (readyState, send(text), close()), with:
//   link.video       a <video> element playing the received stream (audio and video in one MediaStream, so
//                    the browser keeps them in sync); app.js draws its frames on the canvas
//   link.frameInfo(rtpTimestamp)  the server's `frame` message for a picture (its media header's fields)
//   link.setMic(stream)           send this microphone (null: the page's own audio graph only)
//   link.camera                   with options.input "camera" (generate): {stream, stats()} of the browser's
//                                 camera, sent as a video track (the server scales its pictures to the session)
//   link.input                    an AudioNode: what is connected to it is sent (fed clips, silence)
//   link.record(ms) → Promise of {mime, base64}: the page's MediaRecorder recording of the received stream
//   link.codec                    the negotiated video codec
//   link.videoDelayMs             the video delay the page asks for to keep the picture on its sound (lipSync)
// hooks: onControl(msg), onClose(code, reason), log(text, cls).
"use strict";

window.fgRtc = (() => {
  const CONNECT_MS = 5000;
  const SYNC_MS = 500;  // how often the video's delay follows the audio's

  // Lip sync: the picture waits as long as the sound does. The audio's path (its jitter buffer and output) is
  // longer than the video's, and Chromium's own sync closes that gap slowly (figures: docs/webrtc.md). Every
  // SYNC_MS the video receiver's jitterBufferTarget is set to the audio's delay over that interval: its jitter
  // buffer, arrival to playout, plus the playout path's delay. The video's target delay from arrival to render
  // then matches the audio's from arrival to the speaker. Returns a stop function.
  function lipSync(pc, link) {
    const video = pc.getReceivers().find((r) => r.track && r.track.kind === "video");
    if (!video || !("jitterBufferTarget" in video)) return () => {};
    let prev = {};
    const delta = (r, p, sum, count) => (r[count] > (p ? p[count] : 0)
      ? 1000 * (r[sum] - (p ? p[sum] : 0)) / (r[count] - (p ? p[count] : 0)) : null);
    const timer = setInterval(async () => {
      let audioMs = null, playoutMs = 0;
      const next = {};
      (await pc.getStats()).forEach((r) => {
        if (r.type === "inbound-rtp" && r.kind === "audio") {
          audioMs = delta(r, prev.audio, "jitterBufferDelay", "jitterBufferEmittedCount");
          next.audio = r;
        } else if (r.type === "media-playout") {
          playoutMs = delta(r, prev.playout, "totalPlayoutDelay", "totalSamplesCount") || 0;
          next.playout = r;
        }
      });
      prev = next;
      if (audioMs === null) return;  // no sound yet (or none in this session)
      const target = Math.min(4000, Math.max(0, Math.round(audioMs + playoutMs)));
      if (Math.abs(target - (link.videoDelayMs || 0)) >= 5) video.jitterBufferTarget = target;
      link.videoDelayMs = video.jitterBufferTarget;
    }, SYNC_MS);
    return () => clearInterval(timer);
  }

  class Refused extends Error {}  // the server said no (a bad option...): no point trying the WebSocket

  async function connect(wsUrl, pipeline, options, audioContext, hooks) {
    const base = new URL(wsUrl);
    base.protocol = base.protocol === "wss:" ? "https:" : "http:";
    // beside the WebSocket's path: /ws → /webrtc/offer; an embedding's /fg/ws → /fg/webrtc/offer (the demo)
    const offerUrl = new URL("webrtc/offer", base);
    offerUrl.search = base.search;
    const configUrl = new URL("webrtc/config", base);
    configUrl.search = base.search;
    let iceServers = [];
    try {
      const r = await fetch(configUrl, { cache: "no-store" });
      if (r.ok) iceServers = (await r.json()).ice_servers.map((s) => ({ urls: s.urls, username: s.username, credential: s.credential }));
    } catch (e) { /* no config: host candidates only */ }

    const pc = new RTCPeerConnection({ iceServers });
    const channel = pc.createDataChannel("control");
    pc.addTransceiver("video", { direction: "recvonly" });
    const dest = audioContext.createMediaStreamDestination();  // the page's outgoing audio: mic + clips
    const audioSender = pc.addTransceiver(dest.stream.getAudioTracks()[0], { direction: "sendrecv" }).sender;
    const camera = options.input === "camera" ? await cameraTrack(pc, options.size) : null;
    const received = new MediaStream();
    const video = document.createElement("video");
    Object.assign(video, { autoplay: true, playsInline: true, muted: true });
    video.style.display = "none";
    document.body.appendChild(video);
    pc.ontrack = (ev) => { received.addTrack(ev.track); video.srcObject = received; video.play().catch(() => {}); };

    const frames = new Map();  // rtp timestamp → the server's frame message
    let closed = false, micSource = null, stopSync = () => {};
    const link = {
      readyState: WebSocket.CONNECTING, video, codec: null, input: dest, received, videoDelayMs: null, camera,
      send(text) { if (channel.readyState === "open") channel.send(text); },
      close() { finish(1000, "closed by the page"); },
      frameInfo(rtp) { const f = frames.get(rtp); frames.delete(rtp); return f; },
      setMic(stream) {
        if (micSource) { micSource.disconnect(); micSource = null; }
        if (stream) { micSource = audioContext.createMediaStreamSource(stream); micSource.connect(dest); }
      },
      record(ms) { return record(received, ms); },
      async pc_stats() { return pc.getStats(); },
    };
    function finish(code, reason) {
      if (closed) return;
      closed = true;
      link.readyState = WebSocket.CLOSED;
      link.setMic(null);
      stopSync();
      if (camera) camera.stop();
      pc.close();
      video.remove();
      hooks.onClose(code, reason);
    }
    channel.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      if (msg.type === "frame") {
        frames.set(msg.rtp_timestamp, msg);
        if (frames.size > 300) frames.delete(frames.keys().next().value);
      } else if (msg.type === "close") {
        finish(msg.code, msg.reason);
      } else if (msg.type !== "rtp") {
        hooks.onControl(msg);
      }
    };
    channel.onclose = () => finish(1006, "data channel closed");
    function abandon() {  // a session that never started: close quietly (the page may fall back meanwhile)
      closed = true;
      channel.onclose = null;
      if (camera) camera.stop();
      pc.close();
      video.remove();
    }

    await pc.setLocalDescription(await pc.createOffer());
    let r;
    try {
      r = await fetch(offerUrl, { method: "POST", headers: { "Content-Type": "application/json" }, cache: "no-store",
                                  body: JSON.stringify({ type: "offer", sdp: pc.localDescription.sdp, pipeline, options }) });
    } catch (e) {
      abandon();
      throw new Error(`offer not delivered: ${e.message}`);
    }
    const body = await r.text();
    if (!r.ok) {
      abandon();
      let msg = body.trim();
      try { const j = JSON.parse(body); msg = `${j.code}: ${j.message}`; } catch (e) { /* plain text */ }
      if (r.status === 501 || r.status === 404) throw new Error(`no WebRTC here (HTTP ${r.status} ${msg})`);
      throw new Refused(`${msg} (HTTP ${r.status})`);
    }
    const answer = JSON.parse(body);
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    const video0 = answer.sdp.split("m=video")[1] || "";
    const pt = (video0.split("\r\n")[0] || "").split(" ")[3];
    const rtpmap = new RegExp(`a=rtpmap:${pt} ([^/\\r]+)`).exec(video0);
    link.codec = rtpmap ? rtpmap[1] : "?";
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the peer connection was not up within ${CONNECT_MS / 1000} s`)), CONNECT_MS);
      const check = () => {
        if (channel.readyState === "open") { clearTimeout(timer); resolve(); }
        else if (pc.connectionState === "failed") { clearTimeout(timer); reject(new Error("ICE failed")); }
      };
      channel.onopen = check;
      pc.onconnectionstatechange = () => {
        check();
        if (closed === false && link.readyState === WebSocket.OPEN && ["failed", "closed"].includes(pc.connectionState)) {
          finish(1006, `peer connection ${pc.connectionState}`);
        }
      };
    }).catch((e) => { abandon(); throw e; });
    link.readyState = WebSocket.OPEN;
    link.audioSender = audioSender;
    stopSync = lipSync(pc, link);
    return link;
  }

  // The browser's camera as a sendonly video track of `pc` (at the session's size when one is asked for);
  // {stream, stop(), stats()}: stats() says what the page shows in its readout (the track's frames sent).
  async function cameraTrack(pc, size) {
    const [w, h] = (size || "").split("x").map(Number);
    const stream = await navigator.mediaDevices.getUserMedia({ video: w && h ? { width: w, height: h } : true });
    const track = stream.getVideoTracks()[0];
    const sender = pc.addTransceiver(track, { direction: "sendonly" }).sender;
    const cam = { stream, sent: 0, on: true };
    const timer = setInterval(async () => {
      (await sender.getStats()).forEach((r) => { if (r.type === "outbound-rtp") cam.sent = r.framesSent || 0; });
    }, 500);
    cam.stop = () => { clearInterval(timer); track.stop(); cam.on = false; };
    cam.stats = () => {
      const st = track.getSettings();
      return { on: cam.on, track: true, sent: cam.sent, width: st.width || 0, height: st.height || 0 };
    };
    return cam;
  }

  // The received stream recorded by the page's own MediaRecorder for `ms`, as base64 (tests decode it).
  function record(stream, ms) {
    return new Promise((resolve, reject) => {
      const mime = ["video/webm;codecs=vp8,opus", "video/webm"].find((t) => MediaRecorder.isTypeSupported(t));
      const rec = new MediaRecorder(stream, { mimeType: mime });
      const parts = [];
      rec.ondataavailable = (ev) => { if (ev.data.size) parts.push(ev.data); };
      rec.onerror = (ev) => reject(ev.error || new Error("MediaRecorder failed"));
      rec.onstop = async () => {
        const bytes = new Uint8Array(await new Blob(parts, { type: mime }).arrayBuffer());
        let bin = "";
        for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        resolve({ mime, base64: btoa(bin) });
      };
      rec.start(250);
      setTimeout(() => rec.stop(), ms);
    });
  }

  return { connect, Refused, CONNECT_MS };
})();
