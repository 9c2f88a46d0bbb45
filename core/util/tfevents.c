// tfevents.c: see tfevents.h.
#include "core/util/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "core/util/crc32c.h"
#include "core/util/fs.h"

#define EVENT_PREFIX "events.out.tfevents."

typedef struct {
    unsigned char* p;
    size_t n, cap;
} Bytes;

static void put(Bytes* b, const void* src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = (unsigned char*)xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_varint(Bytes* b, uint64_t v) {
    unsigned char c[10];
    size_t n = 0;
    do {
        c[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, c, n);
}

static void put_le(Bytes* b, uint64_t v, int bytes) {
    unsigned char c[8];
    for (int i = 0; i < bytes; i++) c[i] = (unsigned char)(v >> (8 * i));
    put(b, c, (size_t)bytes);
}

// A length-delimited field (wire type 2).
static void put_bytes_field(Bytes* b, int field, const void* data, size_t n) {
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put(b, data, n);
}

static double wall_time(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) fail("clock_gettime: %s", strerror(errno));
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Event { wall_time = 1; file_version = 3 } when version is given, else { wall_time = 1; step = 2; summary = 5
// (n values) }.
static void encode_event(Bytes* ev, long long step, const char* version, const char* const* tags, const double* values, int n) {
    uint64_t bits;
    double now = wall_time();
    memcpy(&bits, &now, sizeof bits);
    put_varint(ev, 1 << 3 | 1);
    put_le(ev, bits, 8);
    if (version) {   // the file's header record, as TensorBoard's own writers make it: no step
        put_bytes_field(ev, 3, version, strlen(version));
        return;
    }
    put_varint(ev, 2 << 3 | 0);
    put_varint(ev, (uint64_t)step);
    if (n == 0) return;
    Bytes summary = {0}, value = {0};
    for (int i = 0; i < n; i++) {
        value.n = 0;
        put_bytes_field(&value, 1, tags[i], strlen(tags[i]));
        float x = (float)values[i];
        uint32_t xb;
        memcpy(&xb, &x, sizeof xb);
        put_varint(&value, 2 << 3 | 5);
        put_le(&value, xb, 4);
        put_bytes_field(&summary, 1, value.p, value.n);
    }
    put_bytes_field(ev, 5, summary.p, summary.n);
    free(summary.p);
    free(value.p);
}

// TFRecord: length, masked CRC of the length, data, masked CRC of the data.
static void write_record(FILE* f, const char* path, const Bytes* data) {
    Bytes rec = {0};
    put_le(&rec, data->n, 8);
    uint32_t len_crc = crc32c_masked(rec.p, 8);
    put_le(&rec, len_crc, 4);
    put(&rec, data->p, data->n);
    put_le(&rec, crc32c_masked(data->p, data->n), 4);
    xfwrite(rec.p, 1, rec.n, f, path);
    free(rec.p);
    if (fflush(f) != 0) fail("write error in %s: %s", path, strerror(errno));
}

static uint64_t read_le(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

// The Event's step field (2), or -1 when it has none (the file_version record) or is malformed.
static long long event_step(const unsigned char* p, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint64_t key = 0, v = 0;
        for (int s = 0; i < n && s < 64; s += 7) {
            key |= (uint64_t)(p[i] & 0x7F) << s;
            if (!(p[i++] & 0x80)) break;
        }
        int wire = (int)(key & 7);
        if (wire == 0 || wire == 2) {
            for (int s = 0; i < n && s < 64; s += 7) {
                v |= (uint64_t)(p[i] & 0x7F) << s;
                if (!(p[i++] & 0x80)) break;
            }
            if (wire == 0 && key >> 3 == 2) return (long long)v;
            if (wire == 2) i += v;
        } else if (wire == 1) i += 8;
        else if (wire == 5) i += 4;
        else return -1;
    }
    return -1;
}

// Rewrites path with its intact records of steps below first_step, in order; reading stops at the first
// record that is short or fails its CRC (an interrupted write's tail).
static void truncate_events(const char* path, int first_step) {
    FILE* in = xfopen(path, "rb");
    char tmp[4300];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* out = xfopen(tmp, "wb");
    unsigned char head[12], tail[4];
    Bytes data = {0};
    while (fread(head, 1, 12, in) == 12 && crc32c_masked(head, 8) == (uint32_t)read_le(head + 8, 4)) {
        uint64_t n = read_le(head, 8);
        if (n > (1u << 30)) break;
        data.n = 0;
        if (data.cap < n) data.p = (unsigned char*)xrealloc(data.p, data.cap = (size_t)n);
        if (fread(data.p, 1, (size_t)n, in) != n || fread(tail, 1, 4, in) != 4) break;
        data.n = (size_t)n;
        if (crc32c_masked(data.p, data.n) != (uint32_t)read_le(tail, 4)) break;
        if (event_step(data.p, data.n) < first_step) write_record(out, tmp, &data);
    }
    if (ferror(in)) fail("cannot read %s: %s", path, strerror(errno));
    free(data.p);
    fclose(in);   // read only: nothing to lose
    xfclose(out, tmp);
    if (rename(tmp, path) != 0) fail("cannot replace %s: %s", path, strerror(errno));
}

// The name of dir's event file that sorts last (one run writes one), or 0 when there is none.
static int find_event_file(const char* dir, char* name, size_t size) {
    DIR* d = opendir(dir);
    if (!d) fail("cannot read directory %s: %s", dir, strerror(errno));
    struct dirent* e;
    int found = 0;
    while ((errno = 0, e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, EVENT_PREFIX, strlen(EVENT_PREFIX)) || strstr(e->d_name, ".tmp")) continue;
        if (found && strcmp(e->d_name, name) <= 0) continue;
        snprintf(name, size, "%s", e->d_name);
        found = 1;
    }
    if (errno) fail("cannot read directory %s: %s", dir, strerror(errno));
    closedir(d);
    return found;
}

void event_file_open(EventFile* ev, const char* dir, int first_step) {
    char name[512];
    make_dirs(dir);
    if (first_step > 0 && find_event_file(dir, name, sizeof(name))) {
        path_join(ev->path, sizeof(ev->path), dir, name);
        truncate_events(ev->path, first_step);
        ev->f = xfopen(ev->path, "ab");
        return;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof(host) - 1) != 0) snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    snprintf(name, sizeof(name), EVENT_PREFIX "%lld.%s", (long long)wall_time(), host);
    path_join(ev->path, sizeof(ev->path), dir, name);
    ev->f = xfopen(ev->path, "wb");
    Bytes first = {0};
    encode_event(&first, 0, "brain.Event:2", NULL, NULL, 0);
    write_record(ev->f, ev->path, &first);
    free(first.p);
}

void event_file_write(EventFile* ev, long long step, const char* const* tags, const double* values, int n) {
    if (!ev->f || n == 0) return;
    Bytes data = {0};
    encode_event(&data, step, NULL, tags, values, n);
    write_record(ev->f, ev->path, &data);
    free(data.p);
}

void event_file_close(EventFile* ev) {
    if (ev->f) xfclose(ev->f, ev->path);
    ev->f = NULL;
}
