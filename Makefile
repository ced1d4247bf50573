# Two commands matter: `make run` (the quickstart) and `make test`. Everything installs from this
# checkout into .venv, which later runs reuse (it is rebuilt when pyproject.toml changes).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LBCTL  := $(VENV)/bin/lbctl
STAMP  := $(VENV)/.installed

.PHONY: run test venv crds dashboards images lint cluster-tools cluster-up cluster-down

# Python writes .pyc files for what it imports into .venv (and the checkout's __pycache__, ignored by git,
# Docker and the images' digest) even where the shell sets PYTHONDONTWRITEBYTECODE, as these machines do:
# without them every interpreter of a test run, every lbctl, agent, operator and xdist worker, compiled
# torch, kubernetes and hypothesis from source again (tests/README.md, stop 59).
unexport PYTHONDONTWRITEBYTECODE

# constraints.txt pins the torch that the tests run and the trainer image ships; dev/test-constraints.txt
# the test tools. uv installs them: from its cache (~/.cache/uv) it links the files into a fresh clone's venv
# in about 8 s where pip took about 100 s to unpack torch's 6 GB again, and a cold install downloads in
# parallel (21 s against pip's ~100 s here).
$(STAMP): pyproject.toml constraints.txt dev/test-constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "uv>=0.13"
	$(VENV)/bin/uv pip install --python $(PY) --quiet -c constraints.txt -c dev/test-constraints.txt -e ".[trainer,digits,hf,dev]"
	touch $@

venv: $(STAMP)

run: venv
	$(LBCTL) run examples/quickstart.yaml --local

# A worker per e2e lane (three: they mostly wait on their control planes) and one per core for the unit and
# process tests, which compute: xdist hands those out longest first, in the order tests/conftest.py gives,
# to whichever worker is free, the e2e lanes' workers once their lanes end.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 3 )))

# The venv and the cluster's tools side by side: on a cold machine uv's and apt's downloads then overlap the
# Go build, which takes most of a cold set-up (about 15 minutes on two cores).
test:
	$(MAKE) --no-print-directory -j2 venv cluster-tools
	$(VENV)/bin/ruff check operator trainer_image tests benchmarks dev
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The operator and trainer images (docker or podman): IMAGE_REPOSITORY, IMAGE_TAG, BASE, PUSH=1 (dev/images.sh).
images:
	dev/images.sh

# The test control plane, its real node and the observability tests' Prometheus: Debian's containerd, runc,
# dockerd, debootstrap and registry, and pinned upstream binaries built from their Go modules into
# ~/.cache/largebatch.
cluster-tools:
	tests/cluster/install_packages.sh
	tests/cluster/build_tools.sh

cluster-up: venv cluster-tools
	$(PY) -m tests.cluster up --dir .cluster

cluster-down: venv
	$(PY) -m tests.cluster down --dir .cluster

crds: venv
	$(LBCTL) crd > crds/largebatchjobs.largebatch.io.yaml
	cp crds/largebatchjobs.largebatch.io.yaml charts/largebatch/crds/

# The Grafana dashboards the chart ships, generated from dev/dashboards.py.
dashboards: venv
	$(PY) dev/dashboards.py charts/largebatch/dashboards

lint: venv
	$(VENV)/bin/ruff check operator trainer_image tests benchmarks dev
	$(VENV)/bin/ruff format --check operator trainer_image tests benchmarks dev
