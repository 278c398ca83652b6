# Two commands for a new user: `make demo` and `make test`.
# Both create/reuse the virtual environment .venv, install the package, fetch the Delta Lake
# jars through Maven into the local Maven repository (cached), then do their job.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
CLASSPATH_FILE := build/delta-classpath.txt
FLIGHTS := build/data/flights.parquet

# Executors (local-cluster, clusters) and the driver use the project's environment.
export PYSPARK_PYTHON := $(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(BIN)/python
export PERSON_DP_DELTA_CLASSPATH := $(abspath $(CLASSPATH_FILE))

.PHONY: demo test venv jars data clean dry-run

venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
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

dry-run: $(STAMP)
	$(BIN)/person-dp run --config conf/examples/flights.yaml --dry-run

test: $(STAMP) $(CLASSPATH_FILE)
	$(BIN)/python -m pytest --durations=30 $(PYTEST_ARGS)

clean:
	rm -rf build .pytest_cache
