"""The generate stages over tiny stock-class models: a prompt change applies from the next chunk the denoiser
starts (the chunks before it are those of an unchanged run), ``reset()`` restarts the stream exactly, and an
endless run (1,000 chunks, re-anchoring past the rotary table) keeps its cache and the process's memory flat."""
import json
import subprocess
import sys

import pytest
import torch
from helpers import tiny_generate_folder, tiny_prompt_embeds

from framegraph.models.generate import build_generate_graph, load_generate_model
from framegraph.stream import PortSpec, RecordingSink, Stage

SIZE = (32, 48)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    return {family: tiny_generate_folder(root / family, family) for family in ("wan", "sana")} | {
        "a": tiny_prompt_embeds(root / "a.safetensors", seed=1),
        "b": tiny_prompt_embeds(root / "b.safetensors", seed=2)}


class SwitchPrompt(Stage):
    """Passes latent chunks on; on chunk ``at`` it switches the denoiser's prompt (as a client's config would)."""

    def __init__(self, denoiser, at: int, embeds_file: str, spec: PortSpec):
        super().__init__("switch")
        self.inputs = {"latent": spec}
        self.outputs = {"latent": spec}
        self.denoiser, self.at, self.embeds_file, self.seen = denoiser, at, embeds_file, 0

    def process(self, inputs, out):
        if self.seen == self.at:
            self.denoiser.set_prompt(embeds_file=self.embeds_file)
        self.seen += 1
        out.write("latent").data.copy_(inputs["latent"].data)


def run_chunks(gm, prompt: str, chunks: int, switch: tuple[int, str] | None = None):
    gg = build_generate_graph(gm, size=SIZE, chunks=chunks, prompt_embeds=prompt, chunk_frames=2)
    spec = gg.denoiser.outputs["latent"]
    collect = gg.graph.add(RecordingSink({"latent": PortSpec(spec.shape)}))
    if switch is None:
        gg.graph.connect(gg.denoiser, collect)
    else:
        relay = gg.graph.add(SwitchPrompt(gg.denoiser, *switch, spec))
        gg.graph.connect(gg.denoiser, relay)
        gg.graph.connect(relay, collect)
    video = gg.graph.add(RecordingSink({"video": gg.decode.outputs["video"]}, name="video"))
    gg.graph.connect(gg.decode, video)  # the video runs too; the latents are what is compared
    gg.graph.run()
    return collect.data(), gg.denoiser


@pytest.mark.parametrize("family", ["wan", "sana"])
def test_a_prompt_change_applies_from_the_next_chunk_without_a_restart(setup, family):
    gm = load_generate_model(str(setup[family]))
    plain, _ = run_chunks(gm, str(setup["a"]), 6)
    gm = load_generate_model(str(setup[family]))
    switched, denoiser = run_chunks(gm, str(setup["a"]), 6, switch=(2, str(setup["b"])))
    (first, prompt_a), (k, prompt_b) = denoiser.prompts_used
    assert first == 0 and prompt_b.endswith("b.safetensors")
    assert k in (3, 4)  # chunk 2 seen downstream; the denoiser is at most one chunk ahead (rings of one slot)
    for i in range(6):
        same = torch.equal(plain[i], switched[i])
        assert same == (i < k), f"chunk {i}: {'unchanged' if same else 'changed'} with the switch at chunk {k}"


def test_a_restarted_graph_repeats_its_stream_exactly(setup):
    """Running the graph again resets every stage (the denoiser's cache and noise, the decoder's cache)."""
    gm = load_generate_model(str(setup["wan"]))
    gg = build_generate_graph(gm, size=SIZE, chunks=3, prompt_embeds=str(setup["a"]), chunk_frames=2)
    collect = gg.graph.add(RecordingSink({"video": gg.decode.outputs["video"]}))
    gg.graph.connect(gg.decode, collect)
    runs = []
    for _ in range(2):
        collect.records = []
        gg.graph.run()
        runs.append(torch.stack(collect.data()))
    assert runs[0].shape[0] == 1 + 4 * 5 and torch.equal(runs[0], runs[1])


ENDLESS_RUN = """
import json, os, sys
import psutil, torch
from framegraph.models.generate import decode_chunk, load_generate_model, to_vae_scale
torch.set_num_threads(1)
folder, family = sys.argv[1], sys.argv[2]
gm = load_generate_model(folder)
stream = gm.family.open(gm.transformer, latent_size=(2, 2), chunk_frames=1,
                        **({"backend": "torch"} if family == "sana" else {}))
g = torch.Generator().manual_seed(0)
embeds, mask = torch.randn(1, 4, 16, generator=g), torch.ones(1, 4)
process, state, sizes, rss, finite = psutil.Process(os.getpid()), None, set(), [], True
with torch.no_grad():
    for c in range(1000):
        clean = stream.generate(torch.randn(1, 16, 1, 2, 2, generator=g), embeds, mask, timesteps=[1000],
                                generator=g)
        video, state = decode_chunk(gm.vae, to_vae_scale(gm.vae, clean), state)
        finite = finite and bool(torch.isfinite(video).all())
        if c >= 10:
            sizes.add((stream.state_nbytes(), state.nbytes()))
        if c in (100, 999):
            rss.append(process.memory_info().rss)
print(json.dumps({"sizes": sorted(sizes), "reanchors": stream.reanchors, "rss": rss, "finite": finite}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("family", ["wan", "sana"])
def test_endless_run_keeps_cache_and_memory_flat(setup, family):
    """1,000 one-frame chunks, each decoded: past the tiny models' 64-frame rotary table the stream re-anchors;
    the cache's bytes are constant after warm-up and the process's RSS does not grow. The run has a process of
    its own: in the suite's process other tests' server threads and garbage move the RSS by tens of MiB."""
    done = subprocess.run([sys.executable, "-c", ENDLESS_RUN, str(setup[family]), family],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["finite"]
    assert len(run["sizes"]) == 1, run["sizes"]
    assert run["reanchors"] >= 1000 // 64
    before, after = run["rss"]
    assert after - before < 16 * 2**20, f"RSS grew by {(after - before) / 2**20:.1f} MiB over 900 chunks"
