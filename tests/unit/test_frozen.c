// test_frozen.c: parameter kinds that carry the frozen optimizer (optimizer_kind.h) under ZeRO's holder
// (zero.c), on a GPT-2 L2 whose family copy freezes q|k|v's weights (a block kind) and wpe (the embedding
// unit's second kind). What must hold:
//   - the planner and the holder give the frozen elements no master, no optimizer state and no gradient:
//     their bytes (backend, host with -offload, disk with -nvme) are those of the updated elements only, on
//     one rank and on rank 0 of two, and the plan equals what the holder allocates;
//   - the gradient norm leaves them out; a step leaves their working copy and the model file's values (the
//     working copy stands in for the master they lack) as they were, while every other tensor moves;
//   - a state file holds no span of theirs, passes the checks for its shape, and resumes into another holder
//     byte for byte; a file without them is refused where the kind is not frozen, and a file with state for
//     a kind this run freezes is refused too.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "core/checkpoint/state_file.h"
#include "core/models/catalog.h"
#include "core/models/gpt2/gpt2.h"
#include "core/util/fs.h"
#include "core/zero/optimizer.h"
#include "tests/unit/testlib.h"
#include "zero.h"

#define RANKS_PADDED 2   // the layout splits evenly for up to this many ranks

typedef struct {
    ModelFamily family;
    KindInfo kinds[GPT2_NUM_KINDS];
    ModelShape shape;
    ParamLayout lay;
} Model;

// GPT-2 L2 with `frozen` (a bit per kind) frozen: a copy of the family whose kinds say so.
static void model_init(Model* m, unsigned frozen) {
    if (!shape_from_spec("L2C64H4V200T16", &m->shape)) fail("test_frozen: the shape's spec");
    m->family = *m->shape.family;
    memcpy(m->kinds, m->family.kinds, sizeof(m->kinds));
    for (int k = 0; k < GPT2_NUM_KINDS; k++)
        if (frozen >> k & 1) m->kinds[k].optimizer = OPT_FROZEN;
    m->family.kinds = m->kinds;
    m->shape.family = &m->family;
    layout_build(&m->lay, &m->shape, layout_pad_multiple(RANKS_PADDED));
}

static int tensor_frozen(const ParamLayout* lay, const ParamTensor* t) { return !tensor_optimizer(lay, t)->updates; }

// Elements of frozen tensors in flat [a, b).
static size_t frozen_between(const ParamLayout* lay, size_t a, size_t b) {
    size_t n = 0;
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        size_t lo = t->offset > a ? t->offset : a, hi = t->offset + t->size < b ? t->offset + t->size : b;
        if (tensor_frozen(lay, t) && lo < hi) n += hi - lo;
    }
    return n;
}

// Whether flat element f of unit u is in its trained section (model.h: Unit), where its gradient and state are.
static int in_trained(const ParamLayout* lay, int u, size_t f) { return f >= lay->units[u].offset + lay->units[u].frozen; }

// The elements each of `ranks` ranks holds state for: its piece of every unit's trained section.
static size_t updated_held(const ParamLayout* lay, int ranks) {
    size_t n = 0;
    for (int u = 0; u < lay->num_units; u++) n += (lay->units[u].padded - lay->units[u].frozen) / (size_t)ranks;
    return n;
}

// Every frozen tensor in its unit's frozen section and every other in the trained one; the trained
// section no larger than its tensors need (their 64-element alignment and the padding to the ranks).
static void check_sections(TestStats* st, const ParamLayout* lay) {
    int placed = 1;
    size_t trained = 0, slack = 0;
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        placed &= in_trained(lay, t->unit, t->offset) == !tensor_frozen(lay, t) &&
                  in_trained(lay, t->unit, t->offset + t->size - 1) == !tensor_frozen(lay, t);
        if (!tensor_frozen(lay, t)) trained += t->size, slack += 64;
    }
    for (int u = 0; u < lay->num_units; u++) slack += layout_pad_multiple(RANKS_PADDED);
    size_t held = updated_held(lay, 1);
    check_true(st, "sections_hold_frozen_then_trained", placed && held >= trained && held < trained + slack);
}

static ZeroCaps caps_of(int stage, int offload, int nvme) { return zero_on_disk(zero_offload(zero_caps(stage), offload), nvme); }

// The planned bytes: master and state (AdamW's m, v) for the updated elements only, wherever they live.
static void check_plan(TestStats* st, const Model* frozen, const Model* all, const NvmeConfig* disk) {
    size_t nf = updated_held(&frozen->lay, 1), na = updated_held(&all->lay, 1);
    MemLedger m = {{0}}, a = {{0}};
    zero_plan(&m, &frozen->lay, caps_of(1, 0, 0), 1, DT_BF16, NULL);
    zero_plan(&a, &all->lay, caps_of(1, 0, 0), 1, DT_BF16, NULL);
    check_true(st, "plan_master_and_state_of_updated_only", nf < na && m.bytes[MEM_MASTER] == 4 * nf && m.bytes[MEM_OPTIMIZER] == 8 * nf &&
                                                                a.bytes[MEM_MASTER] == 4 * na && a.bytes[MEM_OPTIMIZER] == 8 * na &&
                                                                m.bytes[MEM_PARAMS] == a.bytes[MEM_PARAMS]);
    // Two ranks hold equal halves of the trained elements' state, whatever the frozen ones are.
    MemLedger two[2] = {{{0}}, {{0}}};
    for (int r = 0; r < 2; r++) zero_plan_rank(&two[r], &frozen->lay, caps_of(1, 0, 0), r, 2, DT_BF16, NULL);
    size_t n2 = updated_held(&frozen->lay, 2);
    check_true(st, "plan_two_ranks_equal_halves_of_the_trained", 2 * n2 == nf && two[0].bytes[MEM_OPTIMIZER] == 8 * n2 &&
                                                                      two[1].bytes[MEM_OPTIMIZER] == 8 * n2 && two[0].bytes[MEM_MASTER] == 4 * n2 &&
                                                                      two[1].bytes[MEM_MASTER] == 4 * n2);
    // fp32 parameters cannot be their own master once the state leaves elements out: a master of its own.
    MemLedger f32 = {{0}}, f32all = {{0}};
    zero_plan(&f32, &frozen->lay, caps_of(0, 0, 0), 1, DT_FP32, NULL);
    zero_plan(&f32all, &all->lay, caps_of(0, 0, 0), 1, DT_FP32, NULL);
    check_true(st, "plan_fp32_master_of_updated_only", f32.bytes[MEM_MASTER] == 4 * nf && f32all.bytes[MEM_MASTER] == 0);
    // -offload 1: master, m, v on the host, and two staging buffers of a bf16 value and an fp32 gradient
    // for each state element (fewer than zero.c's bound of 2^20).
    MemLedger host = {{0}};
    zero_plan(&host, &frozen->lay, caps_of(1, 1, 0), 1, DT_BF16, NULL);
    check_true(st, "plan_offload_host_state_of_updated_only", host.bytes[MEM_HOST_STATE] == 12 * nf + 2 * 6 * nf);
    // Gradients: no room for the frozen tensors (wpe, and q|k|v's weights in each block). ZeRO 0 and 1
    // on one rank: the whole buffer; ZeRO-2: two rotating block slots, the embedding unit's edge slot, the
    // fp32 accumulator of the updated elements and the fp32 share a reduced unit is added through (the
    // largest unit's updated elements, not the unit).
    size_t wpe = param_kind_elems(&frozen->shape, GPT2_WPE), qkvw = param_kind_elems(&frozen->shape, GPT2_QKVW);
    size_t frozen_all = wpe + (size_t)frozen->shape.L * qkvw, largest = 0, largest_updated = 0;
    for (int u = 0; u < frozen->lay.num_units; u++) {
        const Unit* un = &frozen->lay.units[u];
        size_t updated = un->padded - frozen_between(&frozen->lay, un->offset, un->offset + un->padded);
        largest = un->padded > largest ? un->padded : largest;
        largest_updated = updated > largest_updated ? updated : largest_updated;
    }
    for (int stage = 0; stage <= 2; stage++) {
        MemLedger gf = {{0}}, ga = {{0}};
        zero_plan(&gf, &frozen->lay, caps_of(stage, 0, 0), 1, DT_BF16, NULL);
        zero_plan(&ga, &all->lay, caps_of(stage, 0, 0), 1, DT_BF16, NULL);
        size_t saved = stage < 2 ? 2 * frozen_all : 2 * 2 * qkvw + 2 * wpe + 4 * frozen_all + 4 * (largest - largest_updated);
        char name[64];
        snprintf(name, sizeof(name), "plan_z%d_gradients_hold_no_frozen", stage);
        check_true(st, name, gf.bytes[MEM_GRADS] + saved == ga.bytes[MEM_GRADS]);
    }
    // -nvme: each unit's updated elements a range of the store, with the master, m and v in its records.
    size_t len[MAX_UNITS];
    for (int u = 0; u < frozen->lay.num_units; u++) {
        const Unit* un = &frozen->lay.units[u];
        len[u] = un->padded - frozen_between(&frozen->lay, un->offset, un->offset + un->padded);
    }
    MemLedger d = {{0}};
    zero_plan(&d, &frozen->lay, caps_of(1, 1, 1), 1, DT_BF16, disk);
    check_true(st, "plan_nvme_disk_of_updated_only", d.bytes[MEM_DISK_STATE] == nvme_disk_bytes(disk, len, frozen->lay.num_units, 3, 2, 0));
}

static float unif(uint64_t* s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

// Gradients in dt in every unit's buffer of the walk (which has no room for the frozen tensors: model.h's
// unit_grad_index), then reduced as at a step's end; `grads` gets their fp32 values, zero where frozen.
static void load_grads(Zero* z, Backend* be, const ParamLayout* lay, DType dt, float* grads, uint64_t seed) {
    zero_begin_step(z, be);
    ParamStore ps = zero_param_store(z);
    for (int u = lay->num_units - 1; u >= 0; u--) {
        const Unit* un = &lay->units[u];
        size_t len = unit_grad_len(lay, u);
        float* packed = xcalloc(len, 4);
        void* low = xmalloc(len * dtype_size(dt));
        for (size_t i = 0; i < un->size; i++) {
            size_t f = un->offset + i;
            grads[f] = 0.0f;
            if (in_trained(lay, u, f)) packed[unit_grad_index(lay, u, f)] = unif(&seed);
        }
        host_to_dtype(low, dt, packed, len);
        host_from_dtype(packed, low, dt, len);
        for (size_t i = 0; i < un->size; i++)
            if (in_trained(lay, u, un->offset + i)) grads[un->offset + i] = packed[unit_grad_index(lay, u, un->offset + i)];
        be_upload(be, ps.grads(ps.ctx, be, u), low, len * dtype_size(dt));
        ps.grads_done(ps.ctx, be, u);
        free(low), free(packed);
    }
    zero_reduce_grads(z, be);
}

// The working copy in fp32 (held whole: no shard_params here).
static void params_to_host(const ModelState* ms, Backend* be, float* out) {
    void* low = xmalloc(ms->lay->total * dtype_size(ms->dt));
    be_download(be, low, ms->whole_params, ms->lay->total * dtype_size(ms->dt));
    host_from_dtype(out, low, ms->dt, ms->lay->total);
    free(low);
}

// Whether every element of every tensor, frozen (want_same = 1) or not (0), is (is not) equal in a and b.
static int tensors_alike(const ParamLayout* lay, const float* a, const float* b, int frozen, int want_same) {
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (tensor_frozen(lay, t) != frozen) continue;
        for (size_t j = 0; j < t->size; j++)
            if ((a[t->offset + j] == b[t->offset + j]) != want_same) return 0;
    }
    return 1;
}

// One step under caps: the holder's bytes are the plan's, the norm skips the frozen tensors, the step moves
// every other one and leaves them as they were.
static void check_step(TestStats* st, const char* name, const Model* m, ZeroCaps caps, DType dt, const NvmeConfig* disk) {
    const ParamLayout* lay = &m->lay;
    Backend* be = backend_create(0);
    MemLedger mem = {{0}}, plan = {{0}};
    Zero* z = zero_create(be, &mem, lay, caps, NULL, NULL, NULL, dt, disk);
    zero_plan(&plan, lay, caps, 1, dt, disk);
    ModelState ms = zero_model_state(z);
    size_t n = lay->total;
    float *init = xcalloc(n, 4), *grads = xcalloc(n, 4), *before = xcalloc(n, 4), *after = xcalloc(n, 4), *master = xcalloc(n, 4);
    uint64_t seed = 7;
    for (size_t i = 0; i < n; i++) init[i] = 0.1f * unif(&seed);
    zero_set_from_host(z, be, init);
    params_to_host(&ms, be, before);
    load_grads(z, be, lay, dt, grads, 11);
    double ref = 0.0;
    for (int i = 0; i < lay->num_tensors; i++)
        for (size_t j = 0; j < lay->tensors[i].size && !tensor_frozen(lay, &lay->tensors[i]); j++)
            ref += (double)grads[lay->tensors[i].offset + j] * grads[lay->tensors[i].offset + j];
    double norm = grad_global_norm(&ms, be, NULL, NULL);
    OptimizerStep o = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 1234, 0, 1.0f};
    optimizer_step(&ms, be, &o, 1.0f);
    zero_after_update(z, be);
    params_to_host(&ms, be, after);
    zero_master_to_host(z, be, master);
    char full[128];
    snprintf(full, sizeof(full), "%s_holder_allocates_the_plan", name);
    check_true(st, full, memcmp(&mem, &plan, sizeof(mem)) == 0);
    snprintf(full, sizeof(full), "%s_norm_leaves_frozen_out", name);
    check_close(st, full, fabs(norm - sqrt(ref)) / sqrt(ref), 1e-6);
    snprintf(full, sizeof(full), "%s_step_leaves_frozen_unchanged", name);
    check_true(st, full, tensors_alike(lay, before, after, 1, 1) && tensors_alike(lay, before, master, 1, 1));
    snprintf(full, sizeof(full), "%s_step_moves_the_others", name);
    check_true(st, full, tensors_alike(lay, before, after, 0, 0));
    free(init), free(grads), free(before), free(after), free(master);
    zero_destroy(z, be);
    backend_destroy(be);
}

// A state file of rank 0 of one holder under caps, written to path after a step; returns its size.
static long long write_state(const Model* m, ZeroCaps caps, const char* path) {
    Backend* be = backend_create(0);
    MemLedger mem = {{0}};
    Zero* z = zero_create(be, &mem, &m->lay, caps, NULL, NULL, NULL, DT_BF16, NULL);
    ModelState ms = zero_model_state(z);
    float *init = xcalloc(m->lay.total, 4), *grads = xcalloc(m->lay.total, 4);
    uint64_t seed = 3;
    for (size_t i = 0; i < m->lay.total; i++) init[i] = 0.1f * unif(&seed);
    zero_set_from_host(z, be, init);
    load_grads(z, be, &m->lay, DT_BF16, grads, 5);
    OptimizerStep o = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 99, 0, 1.0f};
    optimizer_step(&ms, be, &o, 1.0f);
    zero_after_update(z, be);
    state_file_write(&ms, be, path, 0, 1, 1);
    free(init), free(grads);
    zero_destroy(z, be);
    backend_destroy(be);
    struct stat sb;
    if (stat(path, &sb) != 0) fail("test_frozen: cannot stat %s", path);
    return (long long)sb.st_size;
}

// What a checkpoint's inspection says of dir's state_rank0.bin for shape s.
static int inspect(const char* dir, const ModelShape* s, char* why, size_t n) {
    SpanList all = {0};
    int ok = state_file_inspect(dir, 0, s, DT_BF16, &all, why, n) && spans_cover(&all, s, 1, why, n);
    free(all.items);
    return ok;
}

static unsigned char* file_bytes(const char* path, long* size) {
    FILE* f = xfopen(path, "rb");
    if (fseek(f, 0, SEEK_END) != 0 || (*size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) fail("test_frozen: cannot size %s", path);
    unsigned char* b = (unsigned char*)xmalloc((size_t)*size + 1);
    xfread(b, 1, (size_t)*size, f, path);
    fclose(f);
    return b;
}

static int same_file_bytes(const char* a, const char* b) {
    long na, nb;
    unsigned char *x = file_bytes(a, &na), *y = file_bytes(b, &nb);
    int same = na == nb && memcmp(x, y, (size_t)na) == 0;
    free(x), free(y);
    return same;
}

// The state file resumes: loaded into a fresh holder (model values, then the file), it writes the same bytes.
static int resumes_same_bytes(const Model* m, const char* path, const char* again) {
    Backend* be = backend_create(0);
    MemLedger mem = {{0}};
    Zero* z = zero_create(be, &mem, &m->lay, caps_of(1, 0, 0), NULL, NULL, NULL, DT_BF16, NULL);
    ModelState ms = zero_model_state(z);
    float* vals = xcalloc(m->lay.total, 4);
    zero_set_from_host(z, be, vals);
    StateReader r = {xfopen(path, "rb"), path, NULL, 0};
    state_file_read(&ms, be, &r);
    fclose(r.f);
    state_file_write(&ms, be, again, 0, 1, 1);
    free(vals);
    zero_destroy(z, be);
    backend_destroy(be);
    return same_file_bytes(path, again);
}

static void check_state_files(TestStats* st, const Model* frozen, const Model* all, const char* dir) {
    char path[512], other[512], again[512], why[256];
    snprintf(path, sizeof(path), "%s/state_rank0.bin", dir);
    snprintf(other, sizeof(other), "%s/all/state_rank0.bin", dir);
    snprintf(again, sizeof(again), "%s/again.bin", dir);
    char all_dir[512];
    snprintf(all_dir, sizeof(all_dir), "%s/all", dir);
    make_dirs(all_dir);
    long long bf = write_state(frozen, caps_of(1, 0, 0), path), ba = write_state(all, caps_of(1, 0, 0), other);
    // Per element: master, m, v and the bf16 working copy; 16 bytes per span besides, one span per whole
    // tensor (no -tp here).
    long long skipped = (long long)frozen_between(&frozen->lay, 0, frozen->lay.total), tensors = 0;
    for (int i = 0; i < frozen->lay.num_tensors; i++) tensors += tensor_frozen(&frozen->lay, &frozen->lay.tensors[i]);
    check_true(st, "state_file_holds_no_frozen_values", tensors == 3 && ba - bf == 14 * skipped + 16 * tensors);
    check_true(st, "state_file_passes_its_shape", inspect(dir, &frozen->shape, why, sizeof(why)));
    check_true(st, "state_file_without_frozen_misses_for_adamw", !inspect(dir, &all->shape, why, sizeof(why)) && strstr(why, "miss"));
    check_true(st, "state_file_of_frozen_kind_refused",
               !inspect(all_dir, &frozen->shape, why, sizeof(why)) && strstr(why, "which this run keeps frozen"));
    check_true(st, "state_file_resumes_same_bytes", resumes_same_bytes(frozen, path, again));
}

int main(void) {
    TestStats st = {0, 0};
    char dir[] = "/tmp/frozen-test.XXXXXX";
    if (!mkdtemp(dir)) fail("cannot make a temporary directory");
    Model* frozen = (Model*)xmalloc(sizeof(Model));
    Model* all = (Model*)xmalloc(sizeof(Model));
    model_init(frozen, 1u << GPT2_QKVW | 1u << GPT2_WPE);
    model_init(all, 0);
    NvmeConfig disk = {.dir = dir, .chunk_elems = NVME_CHUNK_ALIGN, .rank = 0};

    check_sections(&st, &frozen->lay);
    check_plan(&st, frozen, all, &disk);
    check_step(&st, "backend_z0_bf16", frozen, caps_of(0, 0, 0), DT_BF16, NULL);
    check_step(&st, "backend_z1_fp32", frozen, caps_of(1, 0, 0), DT_FP32, NULL);
    check_step(&st, "offload_z1_bf16", frozen, caps_of(1, 1, 0), DT_BF16, NULL);
    check_step(&st, "backend_z2_bf16", frozen, caps_of(2, 0, 0), DT_BF16, NULL);
    check_step(&st, "offload2_z2_bf16", frozen, caps_of(2, 2, 0), DT_BF16, NULL);
    check_step(&st, "nvme_z1_bf16", frozen, caps_of(1, 1, 1), DT_BF16, &disk);
    check_state_files(&st, frozen, all, dir);

    free(frozen), free(all);
    remove_path(dir);
    return test_exit(&st);
}
