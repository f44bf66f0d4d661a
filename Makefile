# Two entry points (README): `make demo` runs the whole workflow offline on the demo data;
# `make test` runs the test suite. Both create .venv and install pinned dependencies first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= 2
export PATH := $(abspath $(BIN)):$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv demo test test-label-studio test-fast rulegraph report clean-demo bench paper-smoke

venv: $(STAMP)

# torch==2.14.1 is the CUDA build from the package index (it runs on CPU); torchvision from PyPI is
# built against it and fails to import with a CPU-only torch wheel. lama-cleaner is installed
# --no-deps: its own pins (diffusers 0.16, transformers 4.27) conflict with the rest, and the LaMa /
# OpenCV models we use import with the light dependencies already in requirements.lock.
$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
		echo "CounterFactory needs Python 3.11 or newer (the pinned numpy, pandas, snakemake and transformers do);" \
		"$(PYTHON) is $$($(PYTHON) -V 2>&1). Run: make $(MAKECMDGOALS) PYTHON=python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps lama-cleaner==1.2.5
	$(BIN)/python -m pip install --quiet --no-deps -e .
	# byte-compile the package once: a demo starts ~230 processes, and with PYTHONDONTWRITEBYTECODE set each
	# would compile it again
	$(BIN)/python -m compileall -q src
	touch $@

# the "own data" demo: four photos with a caption CSV through COCO-Counterfactuals' caption and image stages
OWN_DATA_TARGETS := results/demo_own_data/coco_counterfactuals/images/selected_pairs.parquet \
	results/demo_own_data/coco_counterfactuals/report/pair_grid.png

demo: $(STAMP)
	$(BIN)/counterfactory config check config/demo.yaml config/demo_own_data.yaml
	$(BIN)/snakemake all --profile profiles/local --cores $(CORES) --configfile config/demo.yaml
	$(BIN)/snakemake all --report results/demo/report.html --report-stylesheet report/style.css \
		--configfile config/demo.yaml
	$(BIN)/snakemake $(OWN_DATA_TARGETS) --profile profiles/local --cores $(CORES) \
		--configfile config/demo.yaml config/demo_own_data.yaml
	@echo
	@echo "Demo done. Open results/demo/report.html (every study's tables and figures) or"
	@echo "results/demo/report/overview.html; datasets: results/demo/<study>/export/ (Hugging Face layouts)."

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15

# the human verification round trip against a real Label Studio server (tests/test_label_studio.py; opt-in, not
# part of `make test`: Label Studio is a ~1 GB Django application, installed from the package index into its own
# venv because its pins conflict with ours). CI runs it after `make test` (.ci/run).
LABEL_STUDIO_VENV := .venv-label-studio
LABEL_STUDIO_VERSION := 1.23.2
test-label-studio: $(STAMP)
	test -x $(LABEL_STUDIO_VENV)/bin/label-studio || { $(PYTHON) -m venv $(LABEL_STUDIO_VENV) && \
		$(LABEL_STUDIO_VENV)/bin/python -m pip install --quiet label-studio==$(LABEL_STUDIO_VERSION); }
	COUNTERFACTORY_LABEL_STUDIO=$(abspath $(LABEL_STUDIO_VENV))/bin/label-studio \
		$(BIN)/python -m pytest -q tests/test_label_studio.py

# results/rulegraph.dot: the demo's whole rule graph without the bookkeeping rules that feed almost every rule
# (config_write_job, models_build_tiny, nltk_prepare; the graph's label names them); results/rulegraph_full.dot with
# them; results/rulegraph_<study>.dot: one study's rules (render with Graphviz: dot -Tpng -O results/rulegraph*.dot)
RULEGRAPH_STUDIES := coco_counterfactuals social_counterfactuals countercurate spurious_retrieval cvld

rulegraph: $(STAMP)
	$(BIN)/counterfactory config check config/demo.yaml
	mkdir -p results
	$(BIN)/snakemake --configfile config/demo.yaml --rulegraph > results/rulegraph_full.dot
	$(BIN)/counterfactory report rulegraph results/rulegraph_full.dot --out results/rulegraph.dot
	for s in $(RULEGRAPH_STUDIES); do \
		$(BIN)/snakemake --configfile config/demo.yaml --config "studies=[\"$$s\"]" --rulegraph \
			| $(BIN)/counterfactory report rulegraph - --out results/rulegraph_$$s.dot || exit 1; \
	done

report: $(STAMP)
	$(BIN)/counterfactory config check config/demo.yaml
	$(BIN)/snakemake all --profile profiles/local --report results/demo/report.html \
		--report-stylesheet report/style.css --configfile config/demo.yaml

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The paper config at true architecture (not part of `make test`): every model role built from its published
# configuration with random weights (scripts/paper_smoke.py; roles already built are skipped), then the whole DAG
# of the five studies on the demo fixtures with config/paper_smoke.yaml's cuts. Outputs: results/paper_smoke.
paper-smoke: $(STAMP)
	$(BIN)/counterfactory config check config/paper_smoke.yaml
	$(BIN)/python scripts/paper_smoke.py
	$(BIN)/counterfactory preflight --config config/config.yaml --config config/paper_smoke.yaml
	$(BIN)/snakemake all --profile profiles/local --cores $(CORES) \
		--configfile config/config.yaml config/paper_smoke.yaml

clean-demo:
	rm -rf results/demo resources/models/tiny resources/nltk_data
