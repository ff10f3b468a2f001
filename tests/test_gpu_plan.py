"""The GPU plan fits what a lent machine's call carries: benchmarks/gpu_run.sh --plan adds the checkout to the files
that --prepare put in .whl/ (benchmarks/gpu_carry.txt) and holds them to 56 MiB, 8 of the 64 left as a margin."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_run.sh"


def plan(env_carried: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin"} | ({"GPU_CARRIED": str(env_carried)} if env_carried else {})
    return subprocess.run(["bash", str(SCRIPT), "--plan"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_checkout_and_the_carried_files_fit_with_a_margin():
    done = plan()
    assert done.returncode == 0 and "plan: ok" in done.stdout, done.stdout + done.stderr
    mib = int(re.search(r"= (\d+) MiB", done.stdout).group(1))
    assert mib <= 56, done.stdout


def test_the_plan_fails_when_what_is_carried_stops_fitting(tmp_path):
    carried = tmp_path / "carry.txt"
    carried.write_text((REPO / "benchmarks" / "gpu_carry.txt").read_text() + f"{40 * 2**20} av-next.tar.xz\n")
    done = plan(carried)
    assert done.returncode == 1 and "FAIL upload over the limit" in done.stdout, done.stdout


def test_every_file_prepare_fetches_is_pinned():
    text = SCRIPT.read_text()
    wheels = re.search(r"^WHEELS=\((.*?)\)", text, re.S | re.M).group(1).split()
    assert wheels and all(re.fullmatch(r"[\w-]+==[\w.]+", w) for w in wheels), wheels
    assert re.search(r"^SILERO=silero-vad==[\w.]+$", text, re.M)
    assert re.search(r"^GSPLAT_SDIST=gsplat-[\d.]+-src\.tar\.gz", text, re.M)
