// The pipecat-demo page: Pipecat's browser client (PipecatClient + SmallWebRTCTransport) connected to the example
// agent; the bot's video and audio tracks shown and played; typed text sent as RTVI "send-text" (the agent says it).
// window.fgPipecat: the page's state and a recorder of the received stream, for the browser test.
import { BrowserMediaManager, PipecatClient, SmallWebRTCTransport } from "./pipecat-client.js";

const $ = (s) => document.querySelector(s);
const video = $("#bot-video"), audio = $("#bot-audio");
const state = { status: "disconnected", botReady: false, tracks: {}, sent: 0, errors: [] };
let client = null;

function log(text) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("#log").prepend(li);
}

function setStatus(s) {
  state.status = s;
  $("#status").textContent = s;
  const ready = s === "ready";
  $("#text").disabled = $("#send").disabled = !ready;
  $("#connect").textContent = ready || s === "connected" ? "Disconnect" : "Connect";
}

function attach(track) {
  state.tracks[track.kind] = track;
  const el = track.kind === "video" ? video : audio;
  el.srcObject = new MediaStream([track]);
  el.play().catch((e) => log(`${track.kind} does not play yet: ${e.message}`));
  log(`bot ${track.kind} track`);
}

async function connect() {
  client = new PipecatClient({
    transport: new SmallWebRTCTransport({ mediaManager: new BrowserMediaManager() }),
    enableMic: false,
    enableCam: false,
    callbacks: {
      onTransportStateChanged: setStatus,
      onBotReady: () => { state.botReady = true; log("bot ready"); },
      onTrackStarted: (track, participant) => { if (!participant?.local) attach(track); },
      onBotTtsStarted: () => log("the avatar speaks"),
      onError: (e) => { state.errors.push(String(e?.data?.message ?? e)); log(`error: ${state.errors.at(-1)}`); },
    },
  });
  try {
    await client.connect({ webrtcRequestParams: { endpoint: "api/offer" } });
  } catch (e) {
    state.errors.push(String(e?.message ?? e));
    log(`could not connect: ${state.errors.at(-1)}`);
  }
}

$("#connect").addEventListener("click", async () => {
  if (client && state.status !== "disconnected" && state.status !== "error") {
    await client.disconnect();
    return;
  }
  await connect();
});

$("#say").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const text = $("#text").value.trim();
  if (!text || !client) return;
  await client.sendText(text);
  state.sent += 1;
  log(`said: ${text}`);
  $("#text").value = "";
});

function record(ms) {
  // The received stream (the bot's video and audio tracks) recorded for ms milliseconds → base64 WebM.
  const tracks = [state.tracks.video, state.tracks.audio].filter(Boolean);
  const recorder = new MediaRecorder(new MediaStream(tracks), { mimeType: "video/webm;codecs=vp8,opus" });
  const parts = [];
  recorder.ondataavailable = (e) => parts.push(e.data);
  return new Promise((resolve) => {
    recorder.onstop = () => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result.split(",")[1]);
      reader.readAsDataURL(new Blob(parts, { type: "video/webm" }));
    };
    recorder.start(200);
    setTimeout(() => recorder.stop(), ms);
  });
}

window.fgPipecat = {
  state: () => ({
    status: state.status, botReady: state.botReady, tracks: Object.keys(state.tracks), sent: state.sent,
    errors: state.errors, video: { width: video.videoWidth, height: video.videoHeight, time: video.currentTime },
    audio: { paused: audio.paused, time: audio.currentTime },
  }),
  record,
};
