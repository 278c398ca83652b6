# Two commands for a new user: `make demo` and `make test`.
# Both create/reuse the virtual environment .venv, install the package, fetch the Delta Lake
# jars through Maven into the local Maven repository (cached), then do their job.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
CLASSPATH_FILE := build/delta-classpath.txt
FLIGHTS := build/data/flights.parquet
DIST_ZIP := build/dist/person_dp.zip

# Executors (local-cluster, clusters) and the driver use the project's environment.
export PYSPARK_PYTHON := $(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(BIN)/python
export PERSON_DP_DELTA_CLASSPATH := $(abspath $(CLASSPATH_FILE))

.PHONY: demo test venv jars data clean dry-run dist spark-submit-demo bench-scale

venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,airflow]'
	touch $(STAMP)

jars: $(CLASSPATH_FILE)
$(CLASSPATH_FILE): conf/delta-jars.pom.xml
	mkdir -p build
	mvn -q -B -f conf/delta-jars.pom.xml dependency:build-classpath \
	    -Dmdep.includeScope=runtime -Dmdep.outputFile=$(abspath $(CLASSPATH_FILE))
	@echo "Delta jars: in the local Maven repository; classpath in $(CLASSPATH_FILE)"

data: $(FLIGHTS)
$(FLIGHTS): $(STAMP)
	$(BIN)/person-dp prepare-flights --out $(FLIGHTS)

demo: $(STAMP) $(CLASSPATH_FILE) $(FLIGHTS)
	$(BIN)/person-dp run --config conf/examples/flights.yaml

# The package for spark-submit --py-files: the wheel pip builds (pure Python, so a zip Python
# imports from), saved as .zip because pyspark adds only .zip/.egg/.jar py-files to sys.path.
dist: $(STAMP)
	rm -rf build/dist && mkdir -p build/dist
	$(BIN)/python -m pip wheel -q --no-deps -w build/dist .
	cp build/dist/person_dp-*.whl $(DIST_ZIP)
	@echo "package for --py-files: $(DIST_ZIP)"

# The flights job under spark-submit on a local standalone cluster (two executor JVMs), with the
# settings of conf/spark-submit/local-cluster.conf (YARN and Kubernetes: the other files there).
spark-submit-demo: dist $(CLASSPATH_FILE) $(FLIGHTS)
	$(BIN)/spark-submit --properties-file conf/spark-submit/local-cluster.conf \
	    --py-files $(DIST_ZIP) \
	    --jars "$$($(BIN)/person-dp spark-jars)" \
	    bin/person_dp_submit.py run --config conf/examples/flights.yaml

dry-run: $(STAMP)
	$(BIN)/person-dp run --config conf/examples/flights.yaml --dry-run

test: $(STAMP) $(CLASSPATH_FILE)
	$(BIN)/python -m pytest --durations=30 $(PYTEST_ARGS)

# The scale benchmark of benchmarks/README.md ("Scale"), all of it: passes and whole job at 1e6
# and 1e7 records (uniform and Zipf) with DuckDB, the driver-memory probe, then 1e8 records end to
# end (uniform and Zipf), and 10^7 persons of one record each. Not part of `make test`. Writes
# ~16 GB of synthetic Parquet under build/scale-data once (reused), and the report to
# build/scale-report.md; ~60-70 min on an idle 2-core machine.
SCALE_REPORT := build/scale-report.md
bench-scale: SHELL := /bin/bash
bench-scale: .SHELLFLAGS := -o pipefail -c
bench-scale: $(STAMP) $(CLASSPATH_FILE)
	mkdir -p build && : > $(SCALE_REPORT)
	$(BIN)/python -m benchmarks.scale.run --sizes 1e6,1e7 --repeats 3 --job --json build/scale.jsonl | tee -a $(SCALE_REPORT)
	$(BIN)/python -m benchmarks.scale.run --sizes 1e6 --records-per-person 1000 --repeats 3 --job --json build/scale.jsonl | tee -a $(SCALE_REPORT)
	$(BIN)/python -m benchmarks.scale.run --sizes "" --memory-persons 1e5,1e6,1e7 --memory-records 1e7 | tee -a $(SCALE_REPORT)
	$(BIN)/python -m benchmarks.scale.run --sizes 1e8 --skews uniform --passes "" --job --repeats 1 --no-duckdb | tee -a $(SCALE_REPORT)
	$(BIN)/python -m benchmarks.scale.run --sizes 1e7 --records-per-person 1 --skews uniform --repeats 3 --job --no-duckdb --json build/scale.jsonl | tee -a $(SCALE_REPORT)
	$(BIN)/python -m benchmarks.scale.run --sizes 1e8 --skews zipf --passes "" --job --repeats 1 --no-duckdb | tee -a $(SCALE_REPORT)

clean:
	rm -rf build .pytest_cache
