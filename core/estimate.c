// estimate.c: see estimate.h.
#include "estimate.h"

#include <stdio.h>

#include "common.h"
#include "gpt.h"
#include "zero.h"

void memory_plan(MemLedger* out, const GPTShape* s, int ranks, int stage, DType dt, int B, int T, int recompute) {
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    layout_build(lay, s, zero_pad_multiple(ranks));
    memset(out, 0, sizeof(*out));
    zero_plan(out, lay, stage, ranks, dt);
    out->bytes[MEM_ACTIVATIONS] += gpt_activation_bytes(s, dt, B, T, recompute);
    free(lay);
}

static double gib(size_t bytes) { return (double)bytes / (double)(1ull << 30); }

static void print_table(const Config* cfg, const GPTShape* s, int ranks) {
    int sizes[] = {1, 2, 4, 8, 16, 64, ranks};
    int n = ranks == 1 || ranks == 2 || ranks == 4 || ranks == 8 || ranks == 16 || ranks == 64 ? 6 : 7;
    printf("\nGiB per rank (model states + activations at -r %d, b=%d t=%d):\n  ranks     ZeRO-0     ZeRO-1     ZeRO-2     ZeRO-3\n",
           cfg->recompute, cfg->B, cfg->T);
    for (int i = 0; i < n; i++) {
        printf("  %5d", sizes[i]);
        for (int z = 0; z < 4; z++) {
            MemLedger m;
            memory_plan(&m, s, sizes[i], z, cfg->precision, cfg->B, cfg->T, cfg->recompute);
            printf(" %10.2f", gib(mem_total(&m)));
        }
        printf("\n");
    }
    printf("\nactivations per rank by recompute level (b=%d t=%d):", cfg->B, cfg->T);
    for (int r = 0; r <= 3; r++) printf("  -r %d: %.2f GiB", r, gib(gpt_activation_bytes(s, cfg->precision, cfg->B, cfg->T, r)));
    printf("\n");
}

void print_memory_plan(const Config* cfg, const GPTShape* s, int ranks) {
    MemLedger m;
    memory_plan(&m, s, ranks, cfg->zero_stage, cfg->precision, cfg->B, cfg->T, cfg->recompute);
    printf("memory plan per rank, nothing allocated: L=%d C=%d NH=%d V=%d | %s | %d rank%s, ZeRO-%d, -r %d | b=%d t=%d\n",
           s->L, s->C, s->NH, s->V, dtype_name(cfg->precision), ranks, ranks > 1 ? "s" : "", cfg->zero_stage,
           cfg->recompute, cfg->B, cfg->T);
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++) printf("  %-12s %10.3f GiB\n", mem_category_name((MemCategory)c), gib(m.bytes[c]));
    printf("  %-12s %10.3f GiB\n", "total", gib(mem_total(&m)));
    print_table(cfg, s, ranks);
    printf("plan: {");
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++) printf("%s\"%s\": %zu", c ? ", " : "", mem_category_name((MemCategory)c), m.bytes[c]);
    printf("}\n");
}
