# One trainer, two backends: the orchestration in train_gpt.cu + core/ is plain C and is compiled twice,
# linked with the CPU twins (kernels/*.c) into train_gpt_cpu and with the CUDA kernels
# (kernels/backend_cuda.cu, which includes kernels/*.cuh) into train_gpt.
CC        ?= gcc
NVCC      ?= nvcc
PYTHON    ?= /usr/bin/python3
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
GPU_ARCHS ?= 80 90
WARN      := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS    ?= -O3 -march=native
CFLAGS    += $(WARN) -std=gnu11 -fopenmp -fno-math-errno -I. -MMD -MP
LDLIBS    := -lm -fopenmp
NVFLAGS   := -O3 -std=c++17 --expt-relaxed-constexpr -I. $(foreach a,$(GPU_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(GPU_ARCHS)),code=compute_$(lastword $(GPU_ARCHS)) \
             -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter -Werror all-warnings -MMD -MP
# SASS for each of GPU_ARCHS, and the PTX of the last, which the driver compiles for a newer GPU (sm_100,
# sm_120) at the first launch; backend_create names a GPU the binary cannot run on.
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcublasLt -lcublas -lcudart

# -fno-math-errno: nothing reads errno after a math call, and without it sqrtf cannot vectorize (the
# host AdamW, kernels/adamw_host.h); results are the same, correctly rounded either way.
# MPI (the comm layer, core/comm/comm.h): with OpenMPI's mpicc on PATH, core/comm/comm_mpi.c and its hang watchdog
# (core/comm/watchdog.c) are compiled with its flags and every program links libmpi; without it,
# core/comm/comm_single.c, a world of one rank that refuses a multi-rank launch. MPI=0|1 overrides the detection. nvcc takes -L/-l itself, other linker flags through
# -Xlinker/-Xcompiler.
MPICC ?= mpicc
MPI   ?= $(if $(shell command -v $(MPICC) 2>/dev/null),1,0)
ifeq ($(MPI),1)
MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell $(MPICC) --showme:link 2>/dev/null)
ifeq ($(strip $(MPI_LIBS)),)
$(error MPI=1 but "$(MPICC) --showme:link" gave nothing: install OpenMPI (openmpi-bin libopenmpi-dev) or build with MPI=0)
endif
COMM_UNUSED := core/comm/comm_single.c
else
COMM_UNUSED := core/comm/comm_mpi.c core/comm/watchdog.c
endif
comma      := ,
MPI_NVLIBS := $(foreach f,$(MPI_LIBS),$(if $(filter -L% -l%,$(f)),$(f),$(if $(filter -Wl$(comma)%,$(f)),-Xlinker $(patsubst -Wl$(comma)%,%,$(f)),-Xcompiler $(f))))
LDLIBS     += $(MPI_LIBS)
%/comm_mpi.o %/comm/watchdog.o: CFLAGS += $(MPI_CFLAGS)

B := build

# NCCL (the GPU build's bulk collectives on device memory, core/comm/comm_nccl.c, chosen at run time by -comm):
# bootstrapped over MPI, so only with MPI=1, and only ever in train_gpt and the GPU test programs; the CPU
# build does not see it. NCCL=0|1 overrides the detection. NCCL_HOME=DIR names an install (DIR/include/
# nccl.h, DIR/lib*/libnccl.so.2); otherwise the header and the library are each taken from the first of
# $(CUDA_HOME), /usr, /usr/local, and the pip wheel nvidia-nccl-cu* (site-packages/nvidia/nccl, asked of
# python3 on PATH, then $(PYTHON)) that has them. A wheel ships libnccl.so.2 without the libnccl.so
# symlink, hence -l:libnccl.so.2, and lives off the loader's path, hence the rpath.
# dep_inc HEADER,DIRS / dep_lib LIBRARY,DIRS: the first DIR/include (DIR/lib*) holding it; pip_wheel NAME: the folder
# of PyTorch's wheel nvidia-NAME-cu*, asked of python3 on PATH, then $(PYTHON) (used for NCCL and cuDNN).
dep_inc     = $(firstword $(foreach d,$(2),$(if $(wildcard $(d)/include/$(1)),$(d)/include)))
dep_lib     = $(firstword $(foreach d,$(2),$(foreach l,lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu,$(if $(wildcard $(d)/$(l)/$(1)),$(d)/$(l)))))
pip_wheel   = $(shell for py in python3 $(PYTHON); do $$py -c 'import nvidia.$(1) as m; print(list(m.__path__)[0])' 2>/dev/null && break; done)
nccl_inc    = $(call dep_inc,nccl.h,$(1))
nccl_lib    = $(call dep_lib,libnccl.so.2,$(1))
NCCL_WHEEL  = $(call pip_wheel,nccl)
NCCL_DIRS  := $(if $(NCCL_HOME),$(NCCL_HOME),$(CUDA_HOME) /usr /usr/local)
ifneq ($(CUDA_HOME)$(NCCL_HOME),)
# $(or) stops at its first non-empty argument: Python is asked only when the system has no NCCL.
NCCL_INC   := $(or $(call nccl_inc,$(NCCL_DIRS)),$(if $(NCCL_HOME),,$(call nccl_inc,$(NCCL_WHEEL))))
NCCL_LIB   := $(or $(call nccl_lib,$(NCCL_DIRS)),$(if $(NCCL_HOME),,$(call nccl_lib,$(NCCL_WHEEL))))
endif
NCCL       ?= $(if $(filter 1,$(MPI)),$(if $(and $(NCCL_INC),$(NCCL_LIB)),1,0),0)
ifeq ($(NCCL),1)
ifneq ($(MPI),1)
$(error NCCL=1 needs MPI (NCCL is bootstrapped over it): install OpenMPI or build with NCCL=0)
endif
ifeq ($(and $(NCCL_INC),$(NCCL_LIB)),)
$(error NCCL=1 but nccl.h (found: '$(NCCL_INC)') or libnccl.so.2 (found: '$(NCCL_LIB)') is missing under $(NCCL_DIRS) and the nvidia-nccl wheel: set NCCL_HOME=DIR or build with NCCL=0)
endif
NCCL_OBJ   := $(B)/cuda/core/comm/comm_nccl.o
CUDA_LIBS  += -L$(NCCL_LIB) -l:libnccl.so.2 -Xlinker -rpath=$(NCCL_LIB)
$(NCCL_OBJ): CFLAGS += $(MPI_CFLAGS) -I$(NCCL_INC) -I$(CUDA_HOME)/include
$(B)/cuda/core/comm/comm_mpi.o: CFLAGS += -DGPT_NCCL
endif
# cuDNN (its graph API behind the cudnn_attention kernel variant, kernels/variants/cudnn_attention.cuh): only ever in
# backend_cuda.cu, so only train_gpt and the GPU test programs link it. CUDNN=0|1 overrides the detection;
# CUDNN_HOME=DIR names an install of cuDNN 9 (DIR/include/cudnn_graph.h, DIR/lib*/libcudnn.so.9); otherwise the
# headers (of cuDNN 9: cudnn_version.h says) and the library are each taken from the first of $(CUDA_HOME), /usr,
# /usr/local and PyTorch's pip wheel nvidia-cudnn-cu* (site-packages/nvidia/cudnn) that has them, as for NCCL.
cudnn9      = $(foreach d,$(1),$(if $(shell grep -qs '^\#define CUDNN_MAJOR 9' $(d)/include/cudnn_version.h && echo 9),$(d)))
cudnn_inc   = $(call dep_inc,cudnn_graph.h,$(call cudnn9,$(1)))
cudnn_lib   = $(call dep_lib,libcudnn.so.9,$(1))
CUDNN_WHEEL = $(call pip_wheel,cudnn)
CUDNN_DIRS := $(if $(CUDNN_HOME),$(CUDNN_HOME),$(CUDA_HOME) /usr /usr/local)
ifneq ($(CUDA_HOME)$(CUDNN_HOME),)
CUDNN_INC  := $(or $(call cudnn_inc,$(CUDNN_DIRS)),$(if $(CUDNN_HOME),,$(call cudnn_inc,$(CUDNN_WHEEL))))
CUDNN_LIB  := $(or $(call cudnn_lib,$(CUDNN_DIRS)),$(if $(CUDNN_HOME),,$(call cudnn_lib,$(CUDNN_WHEEL))))
endif
CUDNN      ?= $(if $(and $(CUDNN_INC),$(CUDNN_LIB)),1,0)
ifeq ($(CUDNN),1)
ifeq ($(and $(CUDNN_INC),$(CUDNN_LIB)),)
$(error CUDNN=1 but cudnn_graph.h (found: '$(CUDNN_INC)') or libcudnn.so.9 (found: '$(CUDNN_LIB)') is missing under $(CUDNN_DIRS) and the nvidia-cudnn wheel: set CUDNN_HOME=DIR or build with CUDNN=0)
endif
NVFLAGS    += -DGPT_CUDNN -I$(CUDNN_INC)
CUDA_LIBS  += -L$(CUDNN_LIB) -l:libcudnn.so.9 -Xlinker -rpath=$(CUDNN_LIB)
endif
# core/<concern>/*.c; tokenizer_tool.c is the tokenizer helper program (its own main), below.
CORE_SRC    := $(wildcard base/*.c) $(filter-out $(COMM_UNUSED) core/comm/comm_nccl.c core/tokenizer/tokenizer_tool.c,$(wildcard core/*/*.c)) $(wildcard core/models/*/*.c) zero.c
CPU_KERNELS := $(wildcard kernels/*.c)

CORE_CPU_OBJ  := $(CORE_SRC:%.c=$(B)/cpu/%.o)
CORE_CUDA_OBJ := $(CORE_SRC:%.c=$(B)/cuda/%.o) $(NCCL_OBJ)
CPU_BACKEND   := $(CPU_KERNELS:%.c=$(B)/cpu/%.o)
CUDA_BACKEND  := $(B)/cuda/kernels/backend_cuda.o

.PHONY: all train_gpt_cpu kernels-alone test test-emu test-gpu test-gpu-core test-gpu-variants bench bench-offload bench-cpu bench-nvme run clean tests-bin
all: train_gpt_cpu

# make does not track flags: a stamp per NCCL setting rebuilds the one object whose flags it changes.
$(B)/cuda/.nccl-$(NCCL):
	@mkdir -p $(dir $@) && rm -f $(B)/cuda/.nccl-* && touch $@
$(B)/cuda/core/comm/comm_mpi.o: $(B)/cuda/.nccl-$(NCCL)
$(B)/cuda/.cudnn-$(CUDNN):
	@mkdir -p $(dir $@) && rm -f $(B)/cuda/.cudnn-* && touch $@

train_gpt_cpu: $(B)/cpu/train_gpt.o $(CORE_CPU_OBJ) $(CPU_BACKEND)
	$(CC) -o $@ $^ $(LDLIBS)

train_gpt: $(B)/cuda/train_gpt.o $(CORE_CUDA_OBJ) $(CUDA_BACKEND)
	$(NVCC) $(NVFLAGS) -o $@ $^ $(CUDA_LIBS) $(MPI_NVLIBS) -Xcompiler -fopenmp

# train_gpt.cu holds no CUDA syntax: it is compiled as C in both builds (the name follows llm.c).
$(B)/cpu/train_gpt.o $(B)/cuda/train_gpt.o: train_gpt.cu
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -x c -c $< -o $@
# Two rules, not one with two targets: a pattern rule with several targets is one recipe making all of them.
$(B)/cpu/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(B)/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(B)/cuda/kernels/backend_cuda.o: kernels/backend_cuda.cu $(wildcard kernels/*.cuh kernels/variants/*.cuh) kernels/kernels.h kernels/dtype.h \
                                  base/gpu_variants.h $(B)/cuda/.cudnn-$(CUDNN)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# Test programs: one C source each, linked with the CPU backend (and, for the kernel check, the GPU one).
TEST_SRC := $(wildcard tests/unit/test_*.c)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(B)/%)
$(B)/test_%: $(B)/cpu/tests/unit/test_%.o $(CORE_CPU_OBJ) $(CPU_BACKEND)
	$(CC) -o $@ $^ $(LDLIBS)
# test_batch_io models the GPU's streams with a backend of its own, so it links no backend.
$(B)/test_batch_io: $(B)/cpu/tests/unit/test_batch_io.o $(B)/cpu/core/model/batch_io.o $(B)/cpu/base/common.o
	$(CC) -o $@ $^ $(LDLIBS)
$(B)/kernel_check_cpu: $(B)/cpu/tests/gpu/kernel_check.o $(CORE_CPU_OBJ) $(CPU_BACKEND)
	$(CC) -o $@ $^ $(LDLIBS)
$(B)/kernel_check_gpu: $(B)/cuda/tests/gpu/kernel_check.o $(CORE_CUDA_OBJ) $(CUDA_BACKEND)
	$(NVCC) $(NVFLAGS) -o $@ $^ $(CUDA_LIBS) $(MPI_NVLIBS) -Xcompiler -fopenmp
# The comm tests on real device memory: the MPI staging path, and NCCL with --comm nccl.
$(B)/comm_check_gpu: $(B)/cuda/tests/unit/test_comm.o $(CORE_CUDA_OBJ) $(CUDA_BACKEND)
	$(NVCC) $(NVFLAGS) -o $@ $^ $(CUDA_LIBS) $(MPI_NVLIBS) -Xcompiler -fopenmp
# The cudnn_attention variant's graphs, descriptor by descriptor (and, with --plan on a GPU, their plans).
$(B)/cudnn_graph_check: tests/gpu/cudnn_graph_check.cu kernels/cudnn_graph.cuh kernels/attention_cudnn_graphs.cuh $(B)/cuda/base/common.o
	$(NVCC) $(NVFLAGS) -o $@ tests/gpu/cudnn_graph_check.cu $(B)/cuda/base/common.o $(CUDA_LIBS)
# The fenced CPU build (kernels/backend_cpu.c, tests/system/t_fence.sh): backend memory that host code cannot touch,
# as on a GPU. Same objects as train_gpt_cpu but the kernels'.
FENCE_BACKEND := $(CPU_KERNELS:%.c=$(B)/fence/%.o)
$(B)/fence/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DBACKEND_FENCE -c $< -o $@
$(B)/train_gpt_fenced: $(B)/cpu/train_gpt.o $(CORE_CPU_OBJ) $(FENCE_BACKEND)
	$(CC) -o $@ $^ $(LDLIBS)
$(B)/fence_check: $(B)/cpu/tests/unit/fence_check.o $(CORE_CPU_OBJ) $(FENCE_BACKEND)
	$(CC) -o $@ $^ $(LDLIBS)
# The kernel emulator: the CUDA kernels' own source on the CPU (tests/emu/README.md). `make test-emu`: the
# emulator's own checks and planted bugs, then make test-gpu's script with the emulated kernels standing in
# for the GPU (its report: build/emu_report.md).
include tests/emu/emu.mk
test-emu: $(EMU_TEST_BIN) train_gpt_cpu
	@bash tests/emu/run_emu.sh; a=$$?; REPORT=$${REPORT:-build/emu_report.md} bash tests/gpu/run_gpu.sh --emu; b=$$?; \
	    [ $$a -eq 0 ] && [ $$b -eq 0 ]
# The emulated kernels first: their one large translation unit is the longest compile, so under -j it starts
# while the C objects build beside it.
tests-bin: $(EMU_DIR)/backend_cuda.o train_gpt_cpu $(TEST_BIN) $(B)/train_gpt_fenced $(B)/fence_check $(EMU_TEST_BIN)

# `make test`: every CPU test; last line "N passed, N failed, N skipped"; non-zero exit on any failure.
test: tests-bin
	@PYTHON=$(PYTHON) bash tests/run_all.sh

# `make test-gpu`: on a machine with a GPU, everything in tests/gpu/ (kernels vs CPU twins, a full step
# vs train_gpt_cpu, ranks on one GPU, determinism, resume), then the kernel variants' rows; writes two reports.
# test-gpu-core and test-gpu-variants are its two halves, for time-limited access (tests/gpu/run_part.sh).
GPU_TEST_BIN := train_gpt train_gpt_cpu $(B)/kernel_check_cpu $(B)/kernel_check_gpu $(B)/comm_check_gpu \
                $(if $(filter 1,$(CUDNN)),$(B)/cudnn_graph_check)
test-gpu: $(GPU_TEST_BIN)
	@bash tests/gpu/run_gpu.sh; core=$$?; bash tests/gpu/run_variants.sh && exit $$core
test-gpu-core: $(GPU_TEST_BIN)
	@bash tests/gpu/run_gpu.sh
test-gpu-variants: $(GPU_TEST_BIN)
	@bash tests/gpu/run_variants.sh

bench: train_gpt
	@bash scripts/bench.sh

# `make bench-offload`: d48 with and without -offload, and the largest GPT-2 shape this GPU and host fit (scripts/bench_offload.sh).
bench-offload: train_gpt
	@bash scripts/bench_offload.sh

# `make bench-cpu`: -offload's host AdamW against the bandwidth floor and PyTorch's CPU AdamW (scripts/bench_cpu.sh).
$(B)/bench_adamw: bench/bench_adamw.c base/common.c kernels/adamw_host.h kernels/host_elem.h kernels/dtype.h
	@mkdir -p $(B)
	$(CC) $(CFLAGS) -o $@ bench/bench_adamw.c base/common.c $(LDLIBS)
bench-cpu: $(B)/bench_adamw
	@bash scripts/bench_cpu.sh

# `make bench-nvme`: -nvme's host update against the disk's sequential bandwidth and host-memory offload (scripts/bench_nvme.sh).
$(B)/bench_nvme: $(B)/cpu/bench/bench_nvme.o $(CORE_CPU_OBJ) $(CPU_BACKEND)
	$(CC) -o $@ $^ $(LDLIBS)
bench-nvme: $(B)/bench_nvme
	@bash scripts/bench_nvme.sh

# `make run`: the quick start. Prepares the default corpus if missing, then trains a small model on it.
run: train_gpt_cpu
	@bash scripts/quickstart.sh

clean:
	rm -rf $(B) train_gpt train_gpt_cpu

# build/tokenizer's rule names its sources itself: a .d an older build left for it could name moved files.
-include $(filter-out $(B)/tokenizer.d,$(shell find $(B) -name '*.d' 2>/dev/null))

# ---- the tokenizer helper behind scripts/tokenize.py (which runs this rule itself) ----
TOKENIZER_TOOL_SRC := core/tokenizer/tokenizer_tool.c core/tokenizer/tokenizer_file.c core/tokenizer/bpe.c core/tokenizer/tokenizer_json.c core/tokenizer/nfc.c core/util/json.c base/common.c
$(B)/tokenizer: $(TOKENIZER_TOOL_SRC) core/tokenizer/bpe.h core/tokenizer/tokenizer_file.h core/tokenizer/tokenizer_json.h core/tokenizer/unicode_tables.h core/tokenizer/nfc.h core/tokenizer/nfc_tables.h \
              core/util/json.h core/util/utf8.h base/common.h
	@mkdir -p $(B)
	$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -o $@ $(TOKENIZER_TOOL_SRC) $(LDLIBS)
