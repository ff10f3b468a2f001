// Pipecat's browser client SDK (@pipecat-ai/client-js + @pipecat-ai/small-webrtc-transport) for framegraph's
// pipecat-demo page, bundled into ../pipecat-client.js by ./build.sh.
//
// One addition: BrowserMediaManager. SmallWebRTCTransport's default media manager (DailyMediaManager) handles the
// devices through Daily's call object, which loads its bundle from https://c.daily.co at run time — a machine
// without internet never connects. This one takes the microphone (when enabled) straight from getUserMedia and
// nothing else: the bot's tracks come from the peer connection itself.
import { PipecatClient, RTVIEvent } from "@pipecat-ai/client-js";
import { SmallWebRTCTransport, WavMediaManager } from "@pipecat-ai/small-webrtc-transport";

const MediaManager = Object.getPrototypeOf(WavMediaManager); // the transport library's (unexported) base class

export class BrowserMediaManager extends MediaManager {
  constructor() {
    super();
    this._stream = null;
    this._initialized = false;
  }

  async initialize() {
    if (this._micEnabled && navigator.mediaDevices?.getUserMedia) {
      try {
        this._stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      } catch (e) {
        console.warn(`framegraph: no microphone (${e.message}); the bot is heard and seen all the same`);
      }
    }
    this._initialized = true;
  }

  async connect() {
    if (!this._initialized) await this.initialize();
  }

  async disconnect() {
    this._stream?.getTracks().forEach((t) => t.stop());
    this._stream = null;
    this._initialized = false;
  }

  async userStartedSpeaking() {}
  bufferBotAudio() {}
  async getAllMics() {
    const devices = (await navigator.mediaDevices?.enumerateDevices?.()) ?? [];
    return devices.filter((d) => d.kind === "audioinput");
  }
  getAllCams() { return Promise.resolve([]); }
  getAllSpeakers() { return Promise.resolve([]); }
  async updateMic() {}
  updateCam() {}
  updateSpeaker() {}
  get selectedMic() { return {}; }
  get selectedCam() { return {}; }
  get selectedSpeaker() { return {}; }
  async enableMic(enable) {
    this._micEnabled = enable;
    this._stream?.getAudioTracks().forEach((t) => { t.enabled = enable; });
  }
  enableCam() {}
  enableScreenShare() {}
  get isCamEnabled() { return false; }
  get isMicEnabled() { return this._micEnabled; }
  get isSharingScreen() { return false; }
  tracks() {
    const audio = this._stream?.getAudioTracks()[0];
    return { local: audio ? { audio } : {} };
  }
}

export { PipecatClient, RTVIEvent, SmallWebRTCTransport };
