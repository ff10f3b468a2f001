// AudioWorklet: microphone (the context's rate) → 16 kHz mono PCM16 in 20 ms chunks (320 samples),
// posted to the page as {pcm: ArrayBuffer of Int16, t: the AudioContext time of the chunk's last
// sample} (the page turns that into the sample's capture time on its own clock). Resampling is linear
// interpolation: enough for a live probe; the server's models see the same 16 kHz either way.
class PcmChunker extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / 16000; // input samples per output sample
    this.pos = 0;                   // fractional read position into the current input block
    this.prev = 0;                  // last input sample of the previous block
    this.chunk = new Int16Array(320);
    this.fill = 0;
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const x = input[0];
    // output sample positions t in [-1, x.length - 1): t = -1 means "prev"
    while (this.pos < x.length - 1 + 1e-9) {
      const i = Math.floor(this.pos);
      const frac = this.pos - i;
      const a = i < 0 ? this.prev : x[i];
      const b = i + 1 < x.length ? x[i + 1] : x[x.length - 1];
      const v = Math.max(-1, Math.min(1, a + (b - a) * frac));
      this.chunk[this.fill++] = Math.round(v * 32767);
      if (this.fill === this.chunk.length) {
        // currentTime is the context time of this block's first input sample
        this.port.postMessage({ pcm: this.chunk.buffer, t: currentTime + this.pos / sampleRate },
                              [this.chunk.buffer]);
        this.chunk = new Int16Array(320);
        this.fill = 0;
      }
      this.pos += this.step;
    }
    this.pos -= x.length;
    this.prev = x[x.length - 1];
    return true;
  }
}

registerProcessor("pcm-chunker", PcmChunker);
