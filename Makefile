# Set-up and checks for a fresh clone. Everything installs into ./.venv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
.DEFAULT_GOAL := venv

.PHONY: venv venv-dev venv-plot test train plot clean venv-tf test-tf gpu-check gpu-bundle check-python

# lpjax needs Python 3.11+ (jaxlib, numpy, scipy and flax as pinned in requirements.txt): checked
# first, with one line naming the fix, before a venv is made or anything installed.
FIX_PY := install python3.11 (e.g. apt install python3.11 python3.11-venv) and run make PY=python3.11$(if $(MAKECMDGOALS), $(MAKECMDGOALS))
PY_CHECK = v=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
case "$$v" in \
  3.1[1-9]|3.[2-9][0-9]) ;; \
  "") echo "make: no Python at PY=$(PY); lpjax needs Python 3.11+: $(FIX_PY)" >&2; exit 1;; \
  *) echo "make: lpjax needs Python 3.11+, but PY=$(PY) is Python $$v: $(FIX_PY)" >&2; exit 1;; \
esac

check-python:
	@$(PY_CHECK)

$(BIN)/python:
	@$(PY_CHECK)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Three stamp files, each remade when its requirements file (or pyproject.toml) is newer:
# .installed: what training needs (requirements.txt) and lpjax itself (`make train`);
# .installed-plot: + matplotlib (`make plot`); .installed-dev: + pytest and the notebook runner
# (`make test`). setuptools' "Editable installation" notice (a build warning, not a problem) is
# filtered out of the editable install's output.
$(VENV)/.installed: $(BIN)/python requirements.txt pyproject.toml
	$(BIN)/pip install -q -r requirements.txt
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.installed-plot: $(VENV)/.installed requirements-plot.txt
	$(BIN)/pip install -q -r requirements-plot.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed $(VENV)/.installed-plot requirements-dev.txt
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed
venv-plot: $(VENV)/.installed-plot
venv-dev: $(VENV)/.installed-dev

# XLA:CPU allocates each program's buffers afresh at every call; with this glibc tunable they come
# in 2 MiB transparent huge pages instead of being faulted in 4 KiB at a time, and CPU steps run
# about a fifth faster (lpjax/train/_process.py, cpu_allocator_hint; docs/gemm.md). Ignored by
# glibc before 2.35 and by other C libraries; a value already in the environment wins.
GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1
export GLIBC_TUNABLES

# The default training job: tiny LLaMA, MXFP4 GEMMs + Stable-SPAM, offline corpus, CPU.
CONFIG ?= configs/llama_tiny_mxfp4.py
WORKDIR ?= runs/$(basename $(notdir $(CONFIG)))
train: venv
	$(BIN)/python train.py --config=$(CONFIG) --workdir=$(WORKDIR)

# Loss curves of one or more runs in one PNG (lpjax/plot.py), e.g. an FP4 run beside its bf16
# baseline: make plot RUNS="runs/llama_tiny_mxfp4 runs/llama_tiny_bf16" (OUT=<png> names the file).
RUNS ?= $(WORKDIR)
OUT ?=
plot: venv-plot
	$(BIN)/python -m lpjax.plot $(RUNS) $(if $(OUT),--out=$(OUT))

# The test suite (what .ci/run runs; it lists its 25 slowest tests). PYTEST_ARGS passes extra flags.
test: venv-dev
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=25 $(PYTEST_ARGS)

# The GPU check (benchmarks/gpu_check): stages a-g in the order a g b c e d f, each in its own
# process with its own deadline, <= 540 s on one H100/H200 (one 600 s call). OUT=DIR gets
# everything: report.md (rewritten as the check runs, so a killed run leaves a readable report),
# <gpu>.json and the stage JSONs (flushed after every entry); default runs/gpu_check. No venv
# dependency: a GPU machine's own Python with its CUDA JAX runs it (README, "On a GPU machine that
# already has JAX"). BUNDLE=DIR (a folder written by `make gpu-bundle`) first installs the
# bundle's wheels with `pip install --no-index --no-deps` (never touching the machine's JAX).
# DRY_RUN=1 runs every stage on the CPU with tiny sizes and interpret-mode kernels (about a minute;
# CI runs it). GPU_CHECK_ARGS passes more flags, e.g. "--stages gbc --total-limit 300".
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
DRY_RUN ?=
BUNDLE ?=
gpu-check:
	$(if $(BUNDLE),$(GPU_PY) scripts/gpu_bundle.py install $(BUNDLE) &&) \
	$(if $(BUNDLE),PYTHONPATH="$$($(GPU_PY) scripts/gpu_bundle.py site $(BUNDLE))") \
	$(GPU_PY) -m benchmarks.gpu_check $(if $(filter-out 0,$(DRY_RUN)),--dry-run) \
	$(if $(OUT),--out $(OUT)) $(GPU_CHECK_ARGS)

# The offline bundle for a GPU machine without a package index: BUNDLE=DIR (default
# runs/gpu_bundle) gets lpjax's source and wheels of the pure-Python packages a stock CUDA-JAX
# image lacks (scripts/gpu_bundle.py). Carry DIR there and run `make gpu-check BUNDLE=.. OUT=...`
# from DIR/lpjax (DIR/README.txt says how).
gpu-bundle:
	$(GPU_PY) scripts/gpu_bundle.py build $(or $(BUNDLE),runs/gpu_bundle)

# The optional TensorFlow extra (tf.data reading of tfrecord TFDS datasets) in its own venv, and
# the tests that need it (CI runs the rest; these skip there).
TF_VENV ?= .venv-tf
$(TF_VENV)/bin/python:
	@$(PY_CHECK)
	$(PY) -m venv $(TF_VENV)
	$(TF_VENV)/bin/pip install -q --upgrade pip

venv-tf: $(TF_VENV)/bin/python
	$(TF_VENV)/bin/pip install -q -r requirements-tf.txt
	$(TF_VENV)/bin/pip install -q --no-deps -e .

test-tf: venv-tf
	$(TF_VENV)/bin/python -m pytest -n 2 tests/data/test_tfds_text_tf.py tests/data/test_data.py $(PYTEST_ARGS)

# The optional interop extra (requirements-interop.txt: CPU torch, transformers, compressed-tensors)
# in its own venv, on top of requirements-dev.txt, and the tests where those clients read lpjax's
# exports (they skip without it). Not part of `make test`: the install takes ~7 minutes and 2.3 GB.
.PHONY: venv-interop test-interop
INTEROP_VENV ?= .venv-interop
INTEROP_TESTS := tests/models/test_hf_clients.py tests/models/test_hf_tokenizer.py
$(INTEROP_VENV)/bin/python:
	@$(PY_CHECK)
	$(PY) -m venv $(INTEROP_VENV)
	$(INTEROP_VENV)/bin/pip install -q --upgrade pip

$(INTEROP_VENV)/.installed-interop: $(INTEROP_VENV)/bin/python requirements-dev.txt requirements-interop.txt
	$(INTEROP_VENV)/bin/pip install -q -r requirements-dev.txt
	$(INTEROP_VENV)/bin/pip install -q -r requirements-interop.txt
	$(INTEROP_VENV)/bin/pip install -q --no-deps -e .
	touch $@

venv-interop: $(INTEROP_VENV)/.installed-interop

test-interop: venv-interop
	$(INTEROP_VENV)/bin/python -m pytest $(INTEROP_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(TF_VENV) build *.egg-info
