# The commands users type. See README.md.
BUILD   ?= build
# make install PREFIX=/opt/monarch installs there; the default prefix is CMake's, /usr/local.
PREFIX  ?=
GENERATOR ?= Ninja
CMAKE_FLAGS ?=

.PHONY: all deps configure build install test demo bench clean

all: build

deps:
	@scripts/setup-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G $(GENERATOR) $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD)

# The C++ libraries, headers, CLI and CMake package, and the Python package monarch into the
# system Python's dist-packages (/usr/local/lib/python3.11/dist-packages by default, on
# /usr/bin/python3's path: `import monarch` then works with no PYTHONPATH).
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

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
	@if [ -x $(BUILD)/bin/ft_train ]; then \
	  echo "$(BUILD)/bin/ft_train --out $(BUILD)/ft_train --json-summary $(BUILD)/ft_train/summary.json"; \
	  $(BUILD)/bin/ft_train --out $(BUILD)/ft_train --json-summary $(BUILD)/ft_train/summary.json; \
	else echo "ft_train was not built (configured with MONARCH_BUILD_FT=OFF): the main job is skipped"; fi

bench: deps build
	scripts/run-bench.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan
