# Set-up and checks for a fresh clone. The stack follows the Python that PY names:
# - Python 3.11: the pinned stack (jax 0.10.2): requirements.txt, requirements-dev.txt, in ./.venv;
# - Python 3.12 or 3.13: the current stack (jax 0.12.1): requirements-py312.txt,
#   requirements-py312-dev.txt, in ./.venv-py312 (e.g. make PY=python3.12 test).
# Each stack has its own venv, and a venv made by another Python is refused (check-venv).
PY ?= python3
PY_VERSION := $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
STACK := $(if $(filter 3.11,$(PY_VERSION)),pinned,current)
ifeq ($(STACK),pinned)
VENV ?= .venv
REQUIREMENTS := requirements.txt
REQUIREMENTS_DEV := requirements-dev.txt
else
VENV ?= .venv-py312
REQUIREMENTS := requirements-py312.txt
REQUIREMENTS_DEV := requirements-py312-dev.txt
endif
BIN := $(VENV)/bin
.DEFAULT_GOAL := venv

.PHONY: venv venv-dev venv-plot test test-current train plot clean venv-tf test-tf gpu-check \
	gpu-bundle check-python check-venv

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

# A venv made by another Python than PY (another stack) is refused, never installed into.
check-venv:
	@$(PY_CHECK)
	@v=$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || exit 0; \
	[ "$$v" = "$(PY_VERSION)" ] || { echo "make: VENV=$(VENV) holds Python $$v, but PY=$(PY) is \
	Python $(PY_VERSION) (the $(STACK) stack): use another VENV (the default for it is \
	$(if $(filter pinned,$(STACK)),.venv,.venv-py312)) or remove $(VENV)" >&2; exit 1; }

$(BIN)/python:
	@$(PY_CHECK)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Three stamp files, each remade when its requirements file (or pyproject.toml) is newer:
# .installed: what training needs (requirements.txt) and lpjax itself (`make train`);
# .installed-plot: + matplotlib (`make plot`); .installed-dev: + pytest and the notebook runner
# (`make test`). setuptools' "Editable installation" notice (a build warning, not a problem) is
# filtered out of the editable install's output.
$(VENV)/.installed: $(BIN)/python $(REQUIREMENTS) pyproject.toml
	$(BIN)/pip install -q -r $(REQUIREMENTS)
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.installed-plot: $(VENV)/.installed requirements-plot.txt
	$(BIN)/pip install -q -r requirements-plot.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed $(VENV)/.installed-plot $(REQUIREMENTS_DEV)
	$(BIN)/pip install -q -r $(REQUIREMENTS_DEV)
	touch $@

venv: check-venv $(VENV)/.installed
venv-plot: check-venv $(VENV)/.installed-plot
venv-dev: check-venv $(VENV)/.installed-dev

# XLA:CPU allocates each program's buffers afresh at every call; with this glibc tunable they come
# in 2 MiB transparent huge pages instead of being faulted in 4 KiB at a time, and CPU steps run
# about a fifth faster (lpjax/train/loop/_process.py, cpu_allocator_hint; docs/gemm.md). Ignored by
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

# The test suite (what .ci/run runs; it lists its 25 slowest tests). PYTEST_ARGS passes extra flags,
# TESTS a list of test files or folders (default: all). On the current stack a DeprecationWarning
# that lpjax's own code triggers is an error (tests/conftest.py).
TESTS ?=
# + the interop extra on the pinned stack (below, venv-interop)
INTEROP_STAMP := $(if $(filter pinned,$(STACK)),$(VENV)/.installed-interop)
test: venv-dev $(INTEROP_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=25 $(TESTS) $(PYTEST_ARGS)

# The fast part of the suite on the current stack (what .ci/run runs beside `make test`): the
# interception and its JAX compatibility layer, the layers, the LLaMA models, the Pallas kernels
# lowered for a GPU, a train smoke and the GPU check's tests. About 750 CPU-seconds (jax 0.12.1,
# cold compile cache), i.e. ~6-7 min on 2 idle cores. CURRENT_PY names the Python: python3.12
# (else python3.13) if it runs, else pyenv's (a pyenv shim runs only the versions that `pyenv
# global` names).
CURRENT_PY ?= $(shell for v in 3.12 3.13; do python$$v -c '' 2>/dev/null && { echo python$$v; exit; }; \
	p=$$(pyenv prefix $$v 2>/dev/null) && [ -x "$$p/bin/python$$v" ] && { echo "$$p/bin/python$$v"; exit; }; \
	done; echo python3.12)
CURRENT_TESTS ?= tests/quant/test_jax_compat.py tests/quant/test_intercept.py \
	tests/quant/test_intercept_kept_dtype.py tests/quant/test_intercept_short_k.py tests/nn \
	tests/models/test_hf_llama.py tests/models/test_llama_causality.py tests/models/test_unet_init.py \
	tests/pallas/test_pallas_lowering.py tests/pallas/test_fp4_gemm_lowering.py \
	tests/train/loop/test_train.py::test_tiny_configs_run_and_write_results tests/train/state/test_checkpoint.py \
	tests/benchmarks/gpu_check/test_gpu_check.py \
	tests/benchmarks/gpu_check/test_gpu_check_rehearsal.py::test_make_gpu_check_dry_run_writes_everything_into_out
test-current:
	$(MAKE) --no-print-directory test PY=$(CURRENT_PY) TESTS="$(CURRENT_TESTS)"

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
	@[ "$(STACK)" = pinned ] || { echo "make: the TensorFlow extra is tested on the pinned stack \
	only (requirements-tf.txt pins it beside jax 0.10.2): make PY=python3.11 venv-tf" >&2; exit 1; }
	$(PY) -m venv $(TF_VENV)
	$(TF_VENV)/bin/pip install -q --upgrade pip

venv-tf: $(TF_VENV)/bin/python
	$(TF_VENV)/bin/pip install -q -r requirements-tf.txt
	$(TF_VENV)/bin/pip install -q --no-deps -e .

test-tf: venv-tf
	$(TF_VENV)/bin/python -m pytest -n 2 tests/data/test_tfds_text_tf.py tests/data/test_data.py $(PYTEST_ARGS)

# The interop extra (requirements-interop.txt: CPU torch, transformers, compressed-tensors, gguf),
# installed by `make test` into the pinned stack's venv (its pins sit beside requirements-dev.txt's:
# jax is not reinstalled; ~3 min with a cold pip cache, +1.1 GB), so that CI runs the tests where
# those clients read lpjax's exports (INTEROP_TESTS; they skip without the extra, ~1 CPU-min).
# The current stack (test-current) goes without: the CPU torch wheel on disk is for Python 3.11.
# `make test-interop` runs only those tests.
.PHONY: venv-interop test-interop
INTEROP_TESTS := tests/models/test_hf_clients.py tests/models/test_hf_tokenizer.py \
	tests/models/test_gguf_export.py
$(VENV)/.installed-interop: $(VENV)/.installed-dev requirements-interop.txt
	$(BIN)/pip install -q -r requirements-interop.txt
	touch $@

venv-interop: check-venv $(VENV)/.installed-interop

test-interop: venv-interop
	$(BIN)/python -m pytest $(INTEROP_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv .venv-py312 $(TF_VENV) build *.egg-info
