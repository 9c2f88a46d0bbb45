// gpu_variants.c: see gpu_variants.h.
#include "base/gpu_variants.h"

#include <stdio.h>
#include <string.h>

#include "base/common.h"

static const struct {
    const char* name;
    unsigned bit;
} VARIANTS[] = {
    {"cudnn_attention", VARIANT_CUDNN_ATTENTION}, {"bias_grad_epilogue", VARIANT_BIAS_GRAD_EPILOGUE},
    {"lt_plan_cache", VARIANT_LT_PLAN_CACHE},     {"lt_autotune", VARIANT_LT_AUTOTUNE},
    {"norm_one_pass", VARIANT_NORM_ONE_PASS},     {"adamw_multi", VARIANT_ADAMW_MULTI},
};
#define N_VARIANTS (sizeof VARIANTS / sizeof *VARIANTS)
_Static_assert(N_VARIANTS == GPU_VARIANT_COUNT, "every GpuVariant has a name");

static unsigned variant_bit(const char* name, size_t len) {
    for (size_t i = 0; i < N_VARIANTS; i++)
        if (strlen(VARIANTS[i].name) == len && !strncmp(VARIANTS[i].name, name, len)) return VARIANTS[i].bit;
    char known[256];
    gpu_variants_describe(~0u, known, sizeof known);
    fail("GPT_CUDA_VARIANTS names '%.*s', which is not a kernel variant (known: %s)", (int)len, name, known);
}

unsigned gpu_variants_from_env(void) {
    const char* list = getenv("GPT_CUDA_VARIANTS");
    unsigned set = 0;
    for (const char* p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len) set |= variant_bit(p, len);
        p += len + (p[len] == ',');
    }
    return set;
}

void gpu_variants_describe(unsigned set, char* buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_VARIANTS && n < size; i++)
        if (set & VARIANTS[i].bit) n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? "," : "", VARIANTS[i].name);
    if (!n) snprintf(buf, size, "none");
}

static int env_is_1(const char* name) {
    const char* s = getenv(name);
    return s && s[0] == '1';
}

unsigned gpu_test_hooks_from_env(void) {
    return (env_is_1("GPT_CUDA_NO_FUSED_EPILOGUES") ? GPU_HOOK_NO_FUSED_EPILOGUES : 0u) |
           (env_is_1("GPT_CUDA_ATTENTION_SCALAR") ? GPU_HOOK_ATTENTION_SCALAR : 0u);
}
