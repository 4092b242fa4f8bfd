# strata — the README's two commands. `make run`: set-up, Release build, the built-in default
# training run. `make test`: the same set-up, then every CTest suite that can run here.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: run test build configure deps clean

run: build
	$(BUILD)/apps/strata/strata train

# CTest prints no output of skipped entries: the reasons their binaries printed follow the summary.
test: build
	cd $(BUILD) && { ctest --output-on-failure --timeout 1200 -j$(JOBS); rc=$$?; \
	  awk '/^SKIPPED: all/ {print; p = 1; next} p && /^  [^ ]/ {print; next} {p = 0}' \
	    Testing/Temporary/LastTest.log; exit $$rc; }

build: configure
	cmake --build $(BUILD) -j$(JOBS)

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

deps:
	@bash scripts/install-deps.sh

clean:
	rm -rf $(BUILD)
