# The kernel emulator's build (tests/emu/README.md), included by the Makefile. kernels/backend_cuda.cu and its
# .cuh files (kernels/*.cuh, kernels/variants/*.cuh), rewritten by cuda_to_host.py (launches and __shared__ only), are compiled by clang++ as C++
# against the stand-in CUDA headers in tests/emu/include/, with every load and store instrumented
# (-fsanitize-coverage=edge,trace-loads,trace-stores calls the runtime's checks); the runtime itself is not.
EMU_CXX      ?= clang++
EMU_LINK     ?= g++
EMU_DIR      := $(B)/emu
EMU_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-pass-failed -MMD -MP
# Where the kernels come from and where their emulated build goes: tests/emu/plant.sh points these at a
# copy of kernels/ with one bug planted (and -O1, which compiles faster).
EMU_KERNELS   ?= kernels
EMU_KDIR      ?= $(EMU_DIR)
EMU_KOPT      ?= -O2
EMU_CHECK_BIN ?= $(B)/kernel_check_emu
EMU_CUH        := $(wildcard $(EMU_KERNELS)/*.cuh $(EMU_KERNELS)/variants/*.cuh)
EMU_REWRITTEN  := $(patsubst $(EMU_KERNELS)/%,$(EMU_KDIR)/src/kernels/%,$(EMU_KERNELS)/backend_cuda.cu $(EMU_CUH))
EMU_RUNTIME    := $(patsubst tests/emu/%.cpp,$(EMU_DIR)/%.o,$(filter-out tests/emu/test_%.cpp,$(wildcard tests/emu/*.cpp)))
EMU_OBJ        := $(EMU_KDIR)/backend_cuda.o $(EMU_RUNTIME)
EMU_HEADERS    := $(wildcard tests/emu/*.h tests/emu/include/*.h tests/emu/include/cub/device/*.cuh)

$(EMU_KDIR)/src/kernels/%: $(EMU_KERNELS)/% tests/emu/cuda_to_host.py
	@mkdir -p $(dir $@)
	$(PYTHON) tests/emu/cuda_to_host.py $< $@
# The rewritten copies come first on the include path, so "kernels/x.cuh" finds them, not the originals.
$(EMU_KDIR)/backend_cuda.o: $(EMU_REWRITTEN) $(EMU_HEADERS) kernels/kernels.h kernels/dtype.h base/gpu_variants.h
	$(EMU_CXX) $(EMU_CXXFLAGS) $(EMU_KOPT) -DGPT_EMU -I$(EMU_KDIR)/src -Itests/emu/include -I. \
	    -fsanitize-coverage=edge,trace-loads,trace-stores -x c++ -c $(EMU_KDIR)/src/kernels/backend_cuda.cu -o $@
# make kernels-alone: every kernels/*.cuh and kernels/variants/*.cuh compiles alone, as a translation unit of its
# one #include (its rewritten copy, so the path is the emulator's), parsed by clang++ against the stand-in CUDA
# headers: syntax and types, no code. A file's helpers for the files that include it are unused there, hence
# -Wno-unused-function. The cuDNN graph headers need cudnn.h, which has no stand-in: tests/gpu/cudnn_graph_check.cu,
# which includes one of them before anything else, is their check (tests/system/t_build_cuda.sh).
EMU_ALONE       := $(filter-out %/cudnn_graph.cuh %/attention_cudnn_graphs.cuh,$(EMU_CUH))
EMU_ALONE_OK    := $(patsubst $(EMU_KERNELS)/%,$(EMU_KDIR)/alone/%.ok,$(EMU_ALONE))
EMU_ALONE_FLAGS := $(filter-out -O% -g -MMD -MP,$(EMU_CXXFLAGS)) -Wno-unused-function -fsyntax-only
$(EMU_KDIR)/alone/%.ok: $(EMU_REWRITTEN) $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	@echo '#include "kernels/$*"' > $(@:.ok=.cpp)
	$(EMU_CXX) $(EMU_ALONE_FLAGS) -DGPT_EMU -I$(EMU_KDIR)/src -Itests/emu/include -I. $(@:.ok=.cpp)
	@touch $@
kernels-alone: $(EMU_ALONE_OK)

$(EMU_DIR)/%.o: tests/emu/%.cpp $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Itests/emu/include -I. -c $< -o $@

# The cuBLASLt stand-in's inner loop is fmaf: with FMA named, one instruction instead of a library call (the
# same bits: fmaf rounds once either way).
$(EMU_DIR)/cublaslt.o: EMU_CXXFLAGS += -mfma

# kernel_check (tests/gpu/kernel_check.c, the source the GPU runs) on the emulated kernels.
$(EMU_CHECK_BIN): $(B)/cpu/tests/gpu/kernel_check.o $(CORE_CPU_OBJ) $(EMU_OBJ)
	$(EMU_LINK) -o $@ $^ $(LDLIBS)

# The trainer on the emulated kernels: train_gpt's host code and backend (kernels/backend_cuda.cu) as the
# GPU build has them, its kernels run by the emulator; NCCL is not emulated (-comm mpi only).
$(B)/train_gpt_emu: $(B)/cpu/train_gpt.o $(CORE_CPU_OBJ) $(EMU_OBJ)
	$(EMU_LINK) -o $@ $^ $(LDLIBS)

# The emulator's own tests: its runtime on small CUDA kernels (instrumented like the project's), the PTX
# layouts against plain products, the cuBLASLt stand-in against a float64 reference.
$(EMU_DIR)/src/tests/emu/test_runtime.cu: tests/emu/test_runtime.cu tests/emu/cuda_to_host.py
	@mkdir -p $(dir $@)
	$(PYTHON) tests/emu/cuda_to_host.py $< $@
$(EMU_DIR)/test_runtime: $(EMU_DIR)/src/tests/emu/test_runtime.cu $(EMU_RUNTIME) $(EMU_DIR)/ptx.o $(EMU_HEADERS)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Itests/emu/include -I. -fsanitize-coverage=edge,trace-loads,trace-stores -x c++ \
	    -c $< -o $(EMU_DIR)/test_runtime.o
	$(EMU_LINK) -o $@ $(EMU_DIR)/test_runtime.o $(EMU_RUNTIME)
# The stand-in's test brings its own emu::global_access (a weak one that records the ranges checked), so it
# links cublaslt.o alone, not the runtime.
$(EMU_DIR)/test_cublaslt: tests/emu/test_cublaslt.cpp $(EMU_DIR)/cublaslt.o $(EMU_HEADERS)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Itests/emu/include -I. $< $(EMU_DIR)/cublaslt.o -o $@
# The PTX test brings weak stand-ins for the emu:: functions it needs, so it links ptx.o alone.
$(EMU_DIR)/test_ptx: tests/emu/test_ptx.cpp $(EMU_DIR)/ptx.o $(EMU_HEADERS)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Itests/emu/include -I. $< $(EMU_DIR)/ptx.o -pthread -o $@

EMU_TEST_BIN := $(B)/kernel_check_emu $(B)/train_gpt_emu $(B)/kernel_check_cpu $(EMU_DIR)/test_runtime $(EMU_DIR)/test_ptx $(EMU_DIR)/test_cublaslt
