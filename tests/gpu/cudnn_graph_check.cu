// cudnn_graph_check.cu: the cudnn_attention variant's graphs (kernels/attention_cudnn_graphs.cuh), shape by shape.
// Without a GPU it builds every tensor and operation descriptor of the forward and backward graphs, each
// finalized by cuDNN, which checks their attributes, types and dimensions (what this machine can check of the
// graphs: their finalize as a whole needs a GPU). With a GPU (--plan) it also asks cuDNN for each graph's
// execution plan and prints its workspace, or why there is none; a plan only from an engine with atomics fails.
//
//   cudnn_graph_check [--plan]
//
// Prints "ok <shape>" / "FAIL <shape>: why" and last "N passed, N failed"; exit status 1 on any failure.
// First, so this program is also the check that the graph headers compile alone (the emulator has no cudnn.h).
#include "kernels/attention_cudnn_graphs.cuh"

#include <cuda_runtime.h>
#include <math.h>

#include "base/common.h"
#include "kernels/kernels.h"

struct NamedShape {
    const char* name;
    int B, T, NH, KV, D;
};

// The shapes make test-gpu and make bench train: GPT-2 d12 and the test model, Llama-3.2-1B and the test Llamas.
static const NamedShape SHAPES[] = {
    {"gpt2_d12", 16, 1024, 12, 12, 64}, {"gpt2_test", 4, 128, 4, 4, 32},     {"llama32_1b", 4, 1024, 32, 8, 64},
    {"llama_test_d128", 4, 128, 4, 2, 128}, {"llama_mqa_test", 4, 128, 4, 1, 32},
};

static bool check_one(const SdpaKey& k, cudnnHandle_t h, char* detail, size_t size) {
    GraphBuilder g = sdpa_graph(k);   // every descriptor finalized, or a one-line error and exit
    int n = snprintf(detail, size, "%d operations, %d descriptors", g.n_ops, g.n_owned);
    bool ok = true;
    if (h) {
        CudnnPlan plan;
        char why[256] = "";
        ok = gb_plan(&g, h, &plan, why, sizeof why) && !plan.nondeterministic;
        if (plan.plan)
            snprintf(detail + n, size - (size_t)n, "; plan with %lld bytes of workspace%s", (long long)plan.workspace,
                     plan.nondeterministic ? ", but only from an engine with atomics (nondeterministic)" : "");
        else
            snprintf(detail + n, size - (size_t)n, "; no plan: %s", why);
        cudnn_plan_destroy(&plan);
    }
    gb_destroy(&g);
    return ok;
}

int main(int argc, char** argv) {
    const bool plan = argc > 1 && !strcmp(argv[1], "--plan");
    if (argc > 2 || (argc == 2 && !plan)) fail("usage: cudnn_graph_check [--plan]");
    cudnnHandle_t h = NULL;
    if (plan) {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) fail("cudnn_graph_check --plan needs a GPU");
        CUDNN_CHECK(cudnnCreate(&h));
    }
    printf("# cudnn_graph_check: cuDNN %zu%s\n", cudnnGetVersion(), plan ? ", plans on the GPU" : ", descriptors only");
    int passed = 0, failed = 0;
    for (const NamedShape& s : SHAPES)
        for (int dt = DT_BF16; dt <= DT_FP16; dt++)
            for (int dir = SDPA_FORWARD; dir <= SDPA_BACKWARD; dir++) {
                const SdpaKey k = {dir, dt, s.B, s.T, s.NH, s.KV, s.D, 1};
                char detail[512];
                const bool ok = check_one(k, h, detail, sizeof detail);
                printf("%s %s_%s_%s: %s\n", ok ? "ok" : "FAIL", s.name, dtype_name((DType)dt),
                       dir == SDPA_FORWARD ? "forward" : "backward", detail);
                ok ? passed++ : failed++;
            }
    if (h) CUDNN_CHECK(cudnnDestroy(h));
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
