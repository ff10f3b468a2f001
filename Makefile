# framegraph — two commands:  make demo   |   make test
# Both create .venv and install everything they need first.
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
STAMP  := $(VENV)/.framegraph-installed
# Debian packages the demo and the tests use (espeak-ng speaks typed text and makes training clips;
# chromium runs the browser tests; iproute2's ip and tc build the network namespace and netem impairment of
# the WebRTC tests). Installed with apt-get when running as root, else named.
SYSTEM_PACKAGES ?= espeak-ng libespeak-ng1 chromium iproute2

.PHONY: demo test install system-deps clean help

help:
	@echo "make demo   set up .venv, render the test card to out/, then start the live avatar demo"
	@echo "make test   set up .venv with the test tools and run the whole suite"

$(STAMP): pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "framegraph needs Python >= 3.11 (found $$($(PYTHON) --version)); set PYTHON=python3.11"; exit 1; }
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || \
	  { echo "missing system package: python3-venv (Debian/Ubuntu: sudo apt-get install python3-venv)"; exit 1; }
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps "$(MEDIAPIPE)"
	@touch $(STAMP)

install: $(STAMP)

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing — install them (Debian/Ubuntu: sudo apt-get install$$missing)"; exit 1; \
	  fi; \
	fi

demo: system-deps $(STAMP)
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
