# trident: the commands of the README. `make train` and `make test` work on a fresh clone.

CARGO   ?= cargo
BIN     := target/release/trident
RUNS    ?= runs
DATA    := $(RUNS)/data/shakespeare
PRESET  ?= tiny
THREADS ?=

.PHONY: all build train test lint bench deps clean

all: build

deps:
	@command -v $(CARGO) >/dev/null 2>&1 || { \
	  echo "trident needs a Rust toolchain (cargo): install it with rustup (https://rustup.rs) or your site's module system"; \
	  exit 1; }

build: deps
	$(CARGO) build --release

$(DATA)_text_document.idx: data/tinyshakespeare.txt | build
	@mkdir -p $(RUNS)/data
	$(BIN) prepare --input data/tinyshakespeare.txt --output-prefix $(DATA) --append-eod

# Trains the tiny preset on the bundled corpus, then samples from the final checkpoint.
train: build $(DATA)_text_document.idx
	$(BIN) train --preset $(PRESET) --data-path $(DATA)_text_document \
	  --save $(RUNS)/$(PRESET) --log-json $(RUNS)/$(PRESET)/log.jsonl $(if $(THREADS),--cpu-threads $(THREADS))
	@echo "---- sample from $(RUNS)/$(PRESET) ----"
	$(BIN) generate --load $(RUNS)/$(PRESET) --prompt "ROMEO:" --max-new-tokens 300 --temperature 0.8 --top-k 40

test: deps
	$(CARGO) test --release

lint: deps
	$(CARGO) clippy --release --all-targets -- -D warnings

bench: build
	$(BIN) bench peak
	$(BIN) bench gemm

clean:
	$(CARGO) clean
	rm -rf $(RUNS)
