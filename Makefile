# framegraph — two commands:  make demo   |   make test
# Both create .venv and install what they need first: `make demo` only what the demo runs (the package, aiortc
# for the live page's WebRTC, MediaPipe's face mesh; espeak-ng), `make test` that and the test tools and extras.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is installed first and on its own, so a machine's local build (CPU or CUDA) is used when it
# satisfies the pin; override with e.g. `make test TORCH=torch==2.11.0`.
TORCH  ?= torch==2.13.0
# MediaPipe's face mesh (face landmarks): 0.10.x, whose wheels carry face_landmark.tflite (1.x ones do
# not). Installed with --no-deps: its declared dependencies would put opencv-contrib-python 5 beside our
# opencv-python-headless 4 and pull jax; what the face mesh really needs is in pyproject.toml.
MEDIAPIPE ?= mediapipe==0.10.21
DEMO_STAMP := $(VENV)/.framegraph-demo-installed
STAMP  := $(VENV)/.framegraph-installed
# Debian packages. The demo's: espeak-ng speaks typed text and makes training clips. The tests' add chromium
# (the browser tests) and iproute2 (ip and tc build the network namespace and netem impairment of the WebRTC
# tests). Installed with apt-get when running as root, else named.
DEMO_SYSTEM_PACKAGES ?= espeak-ng libespeak-ng1
TEST_SYSTEM_PACKAGES ?= $(DEMO_SYSTEM_PACKAGES) chromium iproute2

.PHONY: demo test install install-demo system-deps system-deps-demo clean help

help:
	@echo "make demo   set up .venv, render the test card to out/, then start the live avatar demo"
	@echo "make test   set up .venv with the test tools and run the whole suite"
	@echo "make install-demo / make install   only set up .venv (for the demo / for the tests)"

# The demo's environment: torch, the package with its webrtc extra (aiortc: the live page's WebRTC) and
# MediaPipe's face mesh (`avatar train --video`).
$(DEMO_STAMP): pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "framegraph needs Python >= 3.11 (found $$($(PYTHON) --version)); set PYTHON=python3.11"; exit 1; }
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || \
	  { echo "missing system package: python3-venv (Debian/Ubuntu: sudo apt-get install python3-venv)"; exit 1; }
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[webrtc]"
	$(BIN)/pip install -q --no-deps "$(MEDIAPIPE)"
	@touch $(DEMO_STAMP)

# The tests' environment: the demo's and the dev extra (pytest, ruff, Playwright, ONNX export, Ray Serve,
# Pipecat).
$(STAMP): $(DEMO_STAMP)
	$(BIN)/pip install -q -e ".[dev]"
	@touch $(STAMP)

install-demo: $(DEMO_STAMP)

install: $(STAMP)

# `make system-deps PACKAGES="..."`: the Debian packages named installed (as root) or named as missing.
PACKAGES ?= $(TEST_SYSTEM_PACKAGES)
system-deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing — install them (Debian/Ubuntu: sudo apt-get install$$missing)"; exit 1; \
	  fi; \
	fi

system-deps-demo:
	@$(MAKE) --no-print-directory system-deps PACKAGES="$(DEMO_SYSTEM_PACKAGES)"

demo: system-deps-demo $(DEMO_STAMP)
	@mkdir -p out
	$(BIN)/framegraph render --testcard --seconds 5 --fps 25 --size 640x360 --out out/testcard.mp4 \
	  --report out/testcard.json
	@echo "demo: wrote out/testcard.mp4; starting the live avatar demo (Ctrl-C to stop)"
	$(BIN)/framegraph demo

test: system-deps $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out build *.egg-info
