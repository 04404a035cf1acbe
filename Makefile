# Set-up and checks for a fresh clone. Everything installs into ./.venv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv test train clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .

# The default training job: tiny LLaMA, MXFP4 GEMMs + Stable-SPAM, offline corpus, CPU.
CONFIG ?= configs/llama_tiny_mxfp4.py
WORKDIR ?= runs/$(basename $(notdir $(CONFIG)))
train: venv
	$(BIN)/python train.py --config=$(CONFIG) --workdir=$(WORKDIR)

# The test suite (what .ci/run runs). PYTEST_ARGS passes extra flags.
test: venv
	$(BIN)/python -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
