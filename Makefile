# The commands users type. See README.md.
BUILD   ?= build
GENERATOR ?= Ninja
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench clean

all: build

deps:
	@scripts/setup-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G $(GENERATOR) $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD)

test: deps build
	ctest --test-dir $(BUILD) --output-on-failure -j2

demo: deps build
	$(BUILD)/bin/ndslice_demo
	@echo
	$(BUILD)/bin/actors_demo
	@echo
	$(BUILD)/bin/getting_started
	@echo
	PYTHONPATH=$(BUILD)/python /usr/bin/python3 examples/python/getting_started.py
	@echo
	$(BUILD)/bin/ft_train --out $(BUILD)/ft_train --json-summary $(BUILD)/ft_train/summary.json

bench: deps build
	scripts/run-bench.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan
