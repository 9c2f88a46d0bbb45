// dataloader.c: see dataloader.h.
#include "core/data/dataloader.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <sys/stat.h>

#include "base/common.h"
#include "core/data/documents.h"
#include "core/data/packing.h"

#define SHARD16_MAGIC 20240520   // llm.c's GPT-2 shards: uint16 tokens
#define SHARD16_VERSION 1
#define SHARD32_MAGIC 20240801   // llm.c's Llama 3 shards: uint32 tokens, for vocabularies past 65,536
#define SHARD32_VERSION 7
#define SHARD_HEADER_BYTES 1024



struct DataLoader {
    Shard* shards;
    int nshards;
    long long ntok;      // tokens in the whole stream
    long long bt;        // B*T
    long long windows;   // W
    int rank, world, shuffle, vocab;
    uint64_t seed;
    uint32_t* raw;       // B*T+1 tokens as read
    // One open shard at a time (reopened when a window lands in another shard): bounded file handles
    // for any number of shards; a reopen costs microseconds against a window's tens of KiB.
    FILE* f;
    int f_shard;
    // Permutation of the epoch perm_epoch (shuffle only), W entries.
    int64_t* perm;
    long long perm_epoch;
    int B, T;
    int keep_pieces, keep_count;   // the columns of each row dataloader_read keeps (dataloader_keep_columns):
    int keep_first[MAX_KEPT_PIECES];   // keep_pieces ranges of keep_count from these
    // Documents: every shard's mask file, or plain shards with doc_token >= 0; neither: today's windows.
    int masks;
    int doc_token;
    int packed;
    Packing pack;
    int* row_lens;            // one packed row's documents' lengths (T at most)
    PackStats stats;
    long long* win_trained;   // [windows]: labels per window; NULL: B*T each
    uint8_t* mraw;            // B*T+1 mask bytes as read
    FILE* mf;                 // the open mask file (one at a time, as f)
    int mf_shard;
};

static uint32_t le32(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Bytes per token for a shard header's (magic, version); a bad pair is the shard's error.
static int shard_width(const char* path, int32_t magic, int32_t version) {
    int32_t want;
    if (magic == SHARD16_MAGIC) want = SHARD16_VERSION;
    else if (magic == SHARD32_MAGIC) want = SHARD32_VERSION;
    else
        fail("token shard %s has wrong magic %d (expected %d for uint16 tokens or %d for uint32)", path, magic,
             SHARD16_MAGIC, SHARD32_MAGIC);
    if (version != want)
        fail("token shard %s has wrong version %d for magic %d (expected %d)", path, version, magic, want);
    return magic == SHARD32_MAGIC ? 4 : 2;
}

// Validates one shard's header and size; sets its ntok, set id and token width.
static void shard_check(Shard* s) {
    const char* path = s->path;
    FILE* f = xfopen(path, "rb");   // first: the pattern may match a directory or a FIFO, which it refuses
    long long size = file_size(path);
    if (size < 0) fail("cannot stat token shard %s: %s", path, strerror(errno));
    if (size < SHARD_HEADER_BYTES)
        fail("token shard %s is shorter than its %d-byte header (%lld bytes)", path, SHARD_HEADER_BYTES, size);
    unsigned char h[SHARD_HEADER_BYTES];
    xfread(h, 1, sizeof h, f, path);
    if (fclose(f) != 0) fail("cannot close token shard %s: %s", path, strerror(errno));
    int32_t ntok = (int32_t)le32(h + 8);
    s->width = shard_width(path, (int32_t)le32(h), (int32_t)le32(h + 4));
    s->set = (uint64_t)le32(h + 12) | (uint64_t)le32(h + 16) << 32;
    if (ntok < 0) fail("token shard %s has a negative token count %d in its header", path, ntok);
    long long want = SHARD_HEADER_BYTES + (long long)s->width * ntok;
    if (size < want)
        fail("token shard %s is truncated: header says %d tokens of %d bytes (%lld bytes), file has %lld bytes",
             path, ntok, s->width, want, size);
    if (size > want)
        fail("token shard %s has trailing bytes: header says %d tokens of %d bytes (%lld bytes), file has %lld "
             "bytes", path, ntok, s->width, want, size);
    s->ntok = ntok;
}

// Length of NAME when `base` is NAME_train_<6 or more digits>.bin or NAME_val_<...>.bin, else 0.
static size_t dataset_name_len(const char* base) {
    size_t end = strlen(base);
    if (end < 4 || strcmp(base + end - 4, ".bin") != 0) return 0;
    end -= 4;
    size_t digits = 0;
    while (end > 0 && isdigit((unsigned char)base[end - 1])) end--, digits++;
    if (digits < 6 || end == 0 || base[end - 1] != '_') return 0;
    end--;
    static const char* const splits[] = {"_train", "_val"};
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(splits[i]);
        if (end > k && memcmp(base + end - k, splits[i], k) == 0) return end - k;
    }
    return 0;
}

// The shards of one dataset name in one directory, and the first two set ids among them.
typedef struct {
    const char* path;          // its first shard's path: the directory and the name are its prefixes
    size_t dir_len, name_len;  // dir_len includes the '/'
    uint64_t set[2];
    int count[2];
} SetGroup;

static int in_group(const SetGroup* g, const char* path, size_t dir_len, size_t name_len) {
    return g->dir_len == dir_len && g->name_len == name_len && memcmp(g->path, path, dir_len + name_len) == 0;
}

static const char* set_str(uint64_t set, char* buf, size_t cap) {
    if (!set) return "0 (none)";
    snprintf(buf, cap, "%016llx", (unsigned long long)set);
    return buf;
}

// Length of the directory part of `path`, with its '/' (0: none, the working directory).
static size_t dir_prefix_len(const char* path) {
    const char* slash = strrchr(path, '/');
    return slash ? (size_t)(slash - path) + 1 : 0;
}

// tokenize.py replaces a set by renaming its new shards over the old ones and then deleting the rest; a
// SIGKILL or power loss in between leaves a mix of both under valid names, which would train as one
// stream. Refuses a dataset (NAME of NAME_{train,val}_<digits>.bin in one directory) whose shards carry
// more than one set id; shards of different datasets may differ. A file of another name (tokenize.py
// --raw's, llm.c's NAME_val.bin) is one file written at once, a set of its own.
static void check_shard_sets(const Shard* shards, int n) {
    SetGroup* groups = xcalloc((size_t)n, sizeof *groups);
    int ng = 0;
    for (int i = 0; i < n; i++) {
        const char* path = shards[i].path;
        size_t dir_len = dir_prefix_len(path);
        size_t name_len = dataset_name_len(path + dir_len);
        if (name_len == 0) continue;
        int j = 0;
        while (j < ng && !in_group(&groups[j], path, dir_len, name_len)) j++;
        if (j == ng) groups[ng++] = (SetGroup){path, dir_len, name_len, {shards[i].set, 0}, {0, 0}};
        SetGroup* g = &groups[j];
        uint64_t set = shards[i].set;
        if (set == g->set[0]) g->count[0]++;
        else if (g->count[1] == 0 || set == g->set[1]) g->set[1] = set, g->count[1]++;   // a third goes uncounted
    }
    for (int j = 0; j < ng; j++) {
        const SetGroup* g = &groups[j];
        if (g->count[1] == 0) continue;
        char a[24], b[24];
        int dir = g->dir_len > 1 ? (int)g->dir_len - 1 : (int)g->dir_len;   // without its '/'; "/" stays "/"
        fail("token shards %.*s_{train,val}_*.bin in %.*s mix two shard sets: %d of set %s and %d of set %s; a "
             "tokenize.py run that replaced them did not finish: run tokenize.py again", (int)g->name_len,
             g->path + g->dir_len, dir ? dir : 1, dir ? g->path : ".", g->count[0], set_str(g->set[0], a, sizeof a),
             g->count[1], set_str(g->set[1], b, sizeof b));
    }
    free(groups);
}

#define STAGING_PREFIX ".tokenize-"   // tokenize.py's private directory, .tokenize-PID
#define SWITCH_MARKER "SWITCHING"

// tokenize.py writes an fsync'ed DIR/.tokenize-PID/SWITCHING before it renames its first new shard into DIR
// and removes it once the switch (renames, deletions) is complete and synced. A run killed in between can
// leave a part of the new set that no set id shows: one run into an empty directory has one id, and a
// whole new val split beside the whole old train split is two datasets' worth of -i and -j globs, each of
// one id. So a marker refuses the whole directory. A staging directory without it is a run stopped before
// its switch: the shards it would have replaced are intact. `dir` is the directory part of a shard's path
// (with its '/'; "": the working directory).
static void check_switch_marker(const char* dir, size_t dir_len) {
    char shown[PATH_MAX];   // the directory as the message names it
    snprintf(shown, sizeof shown, "%.*s", dir_len > 1 ? (int)dir_len - 1 : dir_len ? 1 : 0, dir_len ? dir : "");
    DIR* d = opendir(dir_len ? shown : ".");
    if (!d) return;   // not listable (execute permission only): its shards are read all the same
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, STAGING_PREFIX, strlen(STAGING_PREFIX)) != 0) continue;
        char marker[PATH_MAX + 300];
        snprintf(marker, sizeof marker, "%.*s%s/%s", (int)dir_len, dir, e->d_name, SWITCH_MARKER);
        struct stat st;
        if (lstat(marker, &st) != 0) continue;
        // Its one line is the run's --name: the dataset to tokenize again.
        char name[256] = "";
        FILE* f = fopen(marker, "rb");
        if (f) {
            size_t got = fread(name, 1, sizeof name - 1, f);
            name[got] = 0;
            name[strcspn(name, "\n")] = 0;
            fclose(f);
        }
        closedir(d);
        if (name[0])
            fail("%s: a tokenize.py run stopped while replacing the shards %s_{train,val}_*.bin there (%s): run "
                 "tokenize.py again", dir_len ? shown : ".", name, marker);
        fail("%s: a tokenize.py run stopped while replacing its shards (%s): run tokenize.py again",
             dir_len ? shown : ".", marker);
    }
    closedir(d);
}

// check_switch_marker once per distinct directory among the matched paths (glob's sorted order keeps a
// directory's paths together, so the last one seen is checked first).
static void check_switch_markers(char* const* paths, size_t n) {
    size_t *first = xmalloc((n ? n : 1) * sizeof *first), *len = xmalloc((n ? n : 1) * sizeof *len);
    size_t ndirs = 0;   // directory k: the first len[k] bytes of paths[first[k]]
    for (size_t i = 0; i < n; i++) {
        size_t l = dir_prefix_len(paths[i]), k = ndirs;
        while (k > 0 && !(len[k - 1] == l && memcmp(paths[first[k - 1]], paths[i], l) == 0)) k--;
        if (k > 0) continue;
        first[ndirs] = i, len[ndirs++] = l;
        check_switch_marker(paths[i], l);
    }
    free(first), free(len);
}

// -pack 1: the documents packed into rows, W = rows / B windows, each window's labels.
static void open_packed(DataLoader* dl, const char* pattern, int truncate_long) {
    long long* row_trained = NULL;
    documents_scan(dl->shards, dl->nshards, dl->bt, 0, NULL, dl->T, truncate_long, &dl->pack, &row_trained, &dl->stats);
    dl->packed = 1;
    if (dl->pack.rows == 0)
        fail("token shards %s: none of their %lld documents fits -t %d (-long truncate keeps the first %d tokens of each)",
             pattern, dl->stats.docs, dl->T, dl->T);
    dl->windows = dl->pack.rows / dl->B;
    dl->stats.rows_left = dl->pack.rows % dl->B;
    if (dl->windows == 0)
        fail("token shards %s: their documents fill %lld rows of -t %d, fewer than one window of -b %d rows", pattern,
             dl->pack.rows, dl->T, dl->B);
    dl->win_trained = xcalloc((size_t)dl->windows, sizeof *dl->win_trained);
    for (long long r = 0; r < dl->windows * dl->B; r++) dl->win_trained[r / dl->B] += row_trained[r];
    free(row_trained);
}

DataLoader* dataloader_open(const char* pattern, int B, int T, int rank, int world, int shuffle, uint64_t seed,
                            int vocab) {
    return dataloader_open_documents(pattern, B, T, rank, world, shuffle, seed, vocab, NULL);
}

DataLoader* dataloader_open_documents(const char* pattern, int B, int T, int rank, int world, int shuffle, uint64_t seed,
                                      int vocab, const DataOptions* opt) {
    if (B <= 0 || T <= 0) fail("data loader: B and T must be positive (got B=%d T=%d)", B, T);
    if (world <= 0 || rank < 0 || rank >= world) fail("data loader: bad rank %d of world %d", rank, world);
    if (vocab <= 0) fail("data loader: vocab must be positive (got %d)", vocab);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) fail("no token shard matches %s", pattern);
    if (rc != 0) fail("cannot expand token shard pattern %s (glob error %d)", pattern, rc);
    if (g.gl_pathc > (size_t)1 << 30) fail("too many token shards match %s", pattern);

    check_switch_markers(g.gl_pathv, g.gl_pathc);

    DataLoader* dl = xcalloc(1, sizeof *dl);
    dl->nshards = (int)g.gl_pathc;
    dl->shards = xcalloc((size_t)dl->nshards, sizeof *dl->shards);
    for (int i = 0; i < dl->nshards; i++) {
        Shard* s = &dl->shards[i];
        size_t n = strlen(g.gl_pathv[i]) + 1;
        s->path = xmalloc(n);
        memcpy(s->path, g.gl_pathv[i], n);
        shard_check(s);
        s->first = dl->ntok;
        dl->ntok += s->ntok;
    }
    globfree(&g);
    check_shard_sets(dl->shards, dl->nshards);

    dl->B = B, dl->T = T;
    dl->bt = (long long)B * T;
    dl->masks = documents_find_masks(dl->shards, dl->nshards, pattern);
    dl->doc_token = opt && !dl->masks ? opt->doc_token : -1;
    dl->mf_shard = -1;
    dl->rank = rank;
    dl->world = world;
    dl->shuffle = shuffle != 0;
    dl->seed = seed;
    dl->vocab = vocab;
    dl->f_shard = -1;
    dl->perm_epoch = -1;
    if (dl->masks && (!opt || opt->pack)) {
        open_packed(dl, pattern, opt && opt->truncate_long);
        dl->raw = xmalloc((size_t)dl->T * sizeof *dl->raw);
        dl->mraw = xmalloc((size_t)dl->T);
        dl->row_lens = xmalloc((size_t)dl->T * sizeof *dl->row_lens);
        return dl;
    }
    if (dl->ntok < dl->bt + 1)
        fail("token shards %s hold %lld tokens, but one window of B*T+1 = %lld tokens is needed (B=%d T=%d)", pattern,
             dl->ntok, dl->bt + 1, B, T);
    dl->windows = (dl->ntok - 1) / dl->bt;
    dl->raw = xmalloc((size_t)(dl->bt + 1) * sizeof *dl->raw);
    if (dl->masks) {
        dl->win_trained = xcalloc((size_t)dl->windows, sizeof *dl->win_trained);
        documents_scan(dl->shards, dl->nshards, dl->bt, dl->windows, dl->win_trained, T, 0, NULL, NULL, &dl->stats);
        dl->mraw = xmalloc((size_t)dl->bt + 1);
    }
    return dl;
}

// splitmix64: a tiny, well-mixed generator; the state lives in the caller.
static uint64_t splitmix64(uint64_t* s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Uniform in [0, n), n > 0, without modulo bias.
static uint64_t rand_below(uint64_t* s, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;   // accept x < limit: a multiple of n values
    uint64_t x;
    do x = splitmix64(s);
    while (x >= limit);
    return x % n;
}

// perm_e for epoch e: Fisher-Yates over 0..W-1 from a state that depends on (seed, e) only.
static void build_perm(DataLoader* dl, long long epoch) {
    long long W = dl->windows;
    if (!dl->perm) dl->perm = xmalloc((size_t)W * sizeof *dl->perm);
    uint64_t s = dl->seed;
    uint64_t st = splitmix64(&s) ^ ((uint64_t)epoch * 0xD1B54A32D192ED03ULL);   // state from (seed, e) only
    for (long long i = 0; i < W; i++) dl->perm[i] = i;
    for (long long i = W - 1; i > 0; i--) {
        long long j = (long long)rand_below(&st, (uint64_t)i + 1);
        int64_t t = dl->perm[i];
        dl->perm[i] = dl->perm[j];
        dl->perm[j] = t;
    }
    dl->perm_epoch = epoch;
}

// The window j (0..W-1) that global window index w visits.
static long long window_of(DataLoader* dl, long long w) {
    long long epoch = w / dl->windows, j = w % dl->windows;
    if (dl->shuffle) {
        if (epoch != dl->perm_epoch) build_perm(dl, epoch);
        j = dl->perm[j];
    }
    return j;
}

long long dataloader_position(const DataLoader* dl, long long step, int ga, int micro) {
    if (step < 0 || ga <= 0 || micro < 0 || micro >= ga)
        fail("data loader: bad position step %lld, micro-step %d of %d", step, micro, ga);
    return (step * ga + micro) * dl->world + dl->rank;
}

static long long window_at(DataLoader* dl, long long step, int ga, int micro) {
    return window_of(dl, dataloader_position(dl, step, ga, micro));
}

long long dataloader_window_start(DataLoader* dl, long long step, int ga, int micro) {
    return window_at(dl, step, ga, micro) * dl->bt;
}

long long dataloader_window_trained(DataLoader* dl, long long w) {
    if (w < 0) fail("data loader: bad window %lld", w);
    return dl->win_trained ? dl->win_trained[window_of(dl, w)] : dl->bt;
}

long long dataloader_step_trained(DataLoader* dl, long long step, int ga) {
    if (step < 0 || ga <= 0) fail("data loader: bad step %lld of %d micro-steps", step, ga);
    if (!dl->win_trained) return dl->bt * ga * dl->world;
    long long sum = 0, w0 = step * ga * dl->world;
    for (long long w = w0; w < w0 + (long long)ga * dl->world; w++) sum += dl->win_trained[window_of(dl, w)];
    return sum;
}

// Read-only stream: fclose only (xfclose would fsync, which can cost a disk flush per shard switch).
static void close_shard(DataLoader* dl) {
    if (dl->f && fclose(dl->f) != 0)
        fail("cannot close token shard %s: %s", dl->shards[dl->f_shard].path, strerror(errno));
    dl->f = NULL;
    dl->f_shard = -1;
}

// Index of the shard holding stream token `pos` (0 <= pos < ntok): the last shard with first <= pos
// (empty shards share their first with the next one, so the last such shard is the non-empty one).
static int shard_of(const DataLoader* dl, long long pos) {
    int lo = 0, hi = dl->nshards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (dl->shards[mid].first <= pos) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The n tokens of `width` bytes (little-endian, whatever the host) at the front of dst, decoded into dst
// in place. From the back: token i's 4 bytes cover only the raw bytes of tokens >= i, decoded already.
static void decode_tokens(uint32_t* dst, long long n, int width) {
    const unsigned char* b = (const unsigned char*)dst;
    for (long long i = n - 1; i >= 0; i--) {
        const unsigned char* p = b + i * width;
        dst[i] = width == 4 ? le32(p) : (uint32_t)p[0] | (uint32_t)p[1] << 8;
    }
}

// Unsigned: a uint32 token past INT_MAX is refused too, not read as a negative id.
static void check_vocab(const DataLoader* dl, const Shard* s, const uint32_t* toks, long long n, long long off) {
    for (long long i = 0; i < n; i++)
        if (toks[i] >= (uint32_t)dl->vocab)
            fail("token shard %s: token %u at position %lld is >= vocab size %d", s->path, toks[i], off + i,
                 dl->vocab);
}

// Reads n tokens starting at stream position pos into dst, checking each against vocab.
static void read_tokens(DataLoader* dl, long long pos, long long n, uint32_t* dst_all) {
    long long done = 0;
    int si = shard_of(dl, pos);
    while (done < n) {
        const Shard* s = &dl->shards[si];
        long long off = pos + done - s->first;   // token offset inside shard si
        long long take = s->ntok - off;
        if (take > n - done) take = n - done;
        if (take > 0) {
            if (dl->f_shard != si) {
                close_shard(dl);
                dl->f = xfopen(s->path, "rb");
                dl->f_shard = si;
            }
            xfseek(dl->f, SHARD_HEADER_BYTES + (long long)s->width * off, SEEK_SET, s->path);
            uint32_t* dst = dst_all + done;
            xfread(dst, (size_t)s->width, (size_t)take, dl->f, s->path);
            decode_tokens(dst, take, s->width);
            check_vocab(dl, s, dst, take, off);
            done += take;
        }
        si++;
    }
}

static void close_mask(DataLoader* dl) {
    if (dl->mf && fclose(dl->mf) != 0) fail("cannot close mask file %s: %s", dl->shards[dl->mf_shard].mask_path, strerror(errno));
    dl->mf = NULL;
    dl->mf_shard = -1;
}

// Reads the mask bytes of the n tokens at stream position pos into dst (checked at open).
static void read_masks(DataLoader* dl, long long pos, long long n, uint8_t* dst) {
    long long done = 0;
    for (int si = shard_of(dl, pos); done < n; si++) {
        const Shard* s = &dl->shards[si];
        long long off = pos + done - s->first, take = s->ntok - off;
        if (take > n - done) take = n - done;
        if (take <= 0) continue;
        if (dl->mf_shard != si) {
            close_mask(dl);
            dl->mf = xfopen(s->mask_path, "rb");
            dl->mf_shard = si;
        }
        xfseek(dl->mf, SHARD_HEADER_BYTES + off, SEEK_SET, s->mask_path);
        xfread(dst + done, 1, (size_t)take, dl->mf, s->mask_path);
        done += take;
    }
}

// Packed window j: rows j*B .. j*B + B - 1, each read document by document.
static void read_packed(DataLoader* dl, long long j, Batch* b) {
    const Packing* pk = &dl->pack;
    for (int row = 0; row < dl->B; row++) {
        long long r = j * dl->B + row, used = 0;
        int nd = 0;
        for (long long k = pk->first[r]; k < pk->first[r + 1]; k++) {
            read_tokens(dl, pk->start[k], pk->len[k], dl->raw + used);
            read_masks(dl, pk->start[k], pk->len[k], dl->mraw + used);
            used += pk->len[k];
            dl->row_lens[nd++] = pk->len[k];
        }
        size_t at = (size_t)row * dl->T;
        packing_fill_row(dl->raw, dl->mraw, dl->row_lens, nd, dl->T, b->tokens + at, b->targets + at, b->pos + at, b->doc + at);
    }
}

static void read_window(DataLoader* dl, long long step, int ga, int micro, Batch* b) {
    long long j = window_at(dl, step, ga, micro);
    if (dataloader_has_documents(dl) && (!b->pos || !b->doc)) fail("internal: a batch of documents without pos and doc");
    if (dl->packed) {
        read_packed(dl, j, b);
        return;
    }
    long long start = j * dl->bt;
    read_tokens(dl, start, dl->bt + 1, dl->raw);
    if (dl->masks) read_masks(dl, start, dl->bt + 1, dl->mraw);
    if (dataloader_has_documents(dl)) {
        packing_fill_window(dl->raw, dl->mraw, dl->doc_token, dl->B, dl->T, b->tokens, b->targets, b->pos, b->doc);
        return;
    }
    for (long long i = 0; i < dl->bt; i++) {
        b->tokens[i] = (int)dl->raw[i];   // < vocab <= INT_MAX
        b->targets[i] = (int)dl->raw[i + 1];
    }
}

void dataloader_keep_columns(DataLoader* dl, int pieces, const int* first, int count) {
    if (pieces < 1 || pieces > MAX_KEPT_PIECES) fail("internal: %d pieces of each row kept", pieces);
    for (int i = 0; i < pieces; i++)
        if (first[i] < (i ? first[i - 1] + count : 0) || count < 1 || first[i] + count > dl->T)
            fail("internal: columns [%d, %d) of rows of %d (piece %d, in increasing order)", first[i], first[i] + count, dl->T, i);
    dl->keep_pieces = pieces;
    dl->keep_count = count;
    memcpy(dl->keep_first, first, (size_t)pieces * sizeof(int));
}

// Row r's kept pieces move to [r n, (r+1) n), n = pieces count, in order: as the pieces increase and do not
// overlap, each piece's source lies at or after its destination, and after every earlier piece's.
static void keep_columns(const DataLoader* dl, int* v) {
    size_t n = (size_t)dl->keep_pieces * dl->keep_count;
    for (int r = 0; r < dl->B; r++)
        for (int i = 0; i < dl->keep_pieces; i++)
            memmove(v + r * n + (size_t)i * dl->keep_count, v + (size_t)r * dl->T + dl->keep_first[i],
                    (size_t)dl->keep_count * sizeof(int));
}

void dataloader_read(DataLoader* dl, long long step, int ga, int micro, Batch* b) {
    read_window(dl, step, ga, micro, b);
    if (dl->keep_pieces == 0 || dl->keep_pieces * dl->keep_count == dl->T) return;
    keep_columns(dl, b->tokens);
    keep_columns(dl, b->targets);
    if (b->pos) keep_columns(dl, b->pos);
}

void dataloader_batch(DataLoader* dl, long long step, int ga, int micro, int* inputs, int* targets) {
    int* scratch = dataloader_has_documents(dl) ? xmalloc(2 * (size_t)dl->bt * sizeof(int)) : NULL;
    Batch b = {inputs, targets, scratch, scratch ? scratch + dl->bt : NULL};
    dataloader_read(dl, step, ga, micro, &b);
    free(scratch);
}

int dataloader_has_masks(const DataLoader* dl) { return dl->masks; }
int dataloader_has_documents(const DataLoader* dl) { return dl->masks || dl->doc_token >= 0; }
int dataloader_is_packed(const DataLoader* dl) { return dl->packed; }
PackStats dataloader_pack_stats(const DataLoader* dl) { return dl->stats; }

long long dataloader_windows_per_epoch(const DataLoader* dl) { return dl->windows; }
long long dataloader_num_tokens(const DataLoader* dl) { return dl->ntok; }
int dataloader_num_shards(const DataLoader* dl) { return dl->nshards; }

void dataloader_close(DataLoader* dl) {
    if (!dl) return;
    close_shard(dl);
    close_mask(dl);
    for (int i = 0; i < dl->nshards; i++) free(dl->shards[i].path), free(dl->shards[i].mask_path);
    free(dl->shards);
    free(dl->raw);
    free(dl->mraw);
    free(dl->row_lens);
    free(dl->win_trained);
    documents_free(&dl->pack);
    free(dl->perm);
    free(dl);
}
