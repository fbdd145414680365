# ladder: `make demo` runs the main job, `make test` runs the whole suite. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch, installed before anything else so no dependency pulls a CUDA build.
# On a GPU machine: make setup TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ladder-installed

# Demo: celerity_lm on the local Ray with two DDP workers, tracked in ./mlruns.db.
DEMO_SET := width=64 depth=3 head_dim=16 seq_len=128 batch_size=32 tpp=20 base_depth=3 max_bytes=8000000 log_every=10

.PHONY: setup demo test test-durations test-numerics ui clean

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,wandb,mujoco]"
	touch $(STAMP)

setup: $(STAMP)

# The demo: one celerity_lm run with 2 DDP workers, then reference runs and a tau sweep with
# loss-curve-collapse early stopping, all on the local Ray, tracked in ./mlruns.db.
demo: setup
	$(VENV)/bin/ladder run celerity_lm --workers 2 --set $(DEMO_SET)
	$(VENV)/bin/ladder sweep sweeps/celerity_reference.py
	$(VENV)/bin/ladder sweep sweeps/celerity_tuning.py
	@echo "Open the results with: $(VENV)/bin/ladder ui   (experiments celerity_lm, celerity_reference, celerity_tuning)"

# Two test processes: most tests are single-threaded CPU work, and the Ray and server tests spend
# much of their time waiting. TEST_WORKERS=0 runs everything in one process. `--dist loadscope`
# sends each test module to one worker, so that a module fixture (minutes of Ray work in
# test_deepspeed and test_load) runs once, not once per worker; the modules go out heaviest first
# (tests/conftest.py, MODULE_SECONDS), not in xdist's order by test count.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder) --durations=25

# The module weights behind that order, measured again: the suite run exactly as `make test` runs
# it (its options reach it through PYTEST_ADDOPTS), with a JUnit report that tests/module_seconds.py
# sums per module into tests/module_seconds.json (modules of DURATIONS_MIN=10 s or more, heaviest first). A run
# with failures still rewrites it (their time counts too), and make still fails. TESTS="a.py b.py"
# runs only those files: write their weights elsewhere then, DURATIONS_OUT=/tmp/w.json, or the
# file keeps only the modules that ran. (-o $(STAMP): setup ran already, as this target's prerequisite.)
DURATIONS_OUT ?= tests/module_seconds.json
DURATIONS_XML ?= $(VENV)/test-durations.xml
DURATIONS_MIN ?= 10
test-durations: setup
	rm -f $(DURATIONS_XML)
	PYTEST_ADDOPTS="$$PYTEST_ADDOPTS --junitxml=$(DURATIONS_XML) -o junit_family=xunit1 $(TESTS)" \
		$(MAKE) --no-print-directory -o $(STAMP) test; status=$$?; \
		$(PY) tests/module_seconds.py $(DURATIONS_XML) --out $(DURATIONS_OUT) --min-seconds $(DURATIONS_MIN) && exit $$status

# The numerically sensitive tests under other CPU kernel paths (tests/numerics.sh says which).
test-numerics: setup
	bash tests/numerics.sh

ui: setup
	$(VENV)/bin/ladder ui

clean:
	rm -rf ladder-runs mlartifacts mlruns.db .pytest_cache
