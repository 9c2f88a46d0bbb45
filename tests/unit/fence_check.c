// fence_check.c: the fenced CPU backend (kernels/backend_cpu.c with -DBACKEND_FENCE; tests/system/t_fence.sh) keeps
// its promise, so that train_gpt_fenced passing means the host code never touched backend memory:
//   - backend memory round-trips through be_upload/be_download and kernels compute on it;
//   - the host reading or writing it directly crashes (SIGSEGV), also right after a kernel and after a
//     backend function that called another one (the fence is back up when the outermost one returns);
//   - a copy given a pointer on the wrong side of the fence, or a kernel given host memory, is a one-line error;
//   - an asynchronous copy whose source changes, or whose destination is written, between its issue and its
//     wait (a race with a GPU's copy engine) is a one-line error; a wait by the main stream alone does not end
//     the window for the host (an upload's source stays in flight, a download's destination stays poison);
//   - it reports itself as a GPU (so the comm layer stages through the host).
// The crashing cases run in child processes.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "kernels/kernels.h"
#include "tests/unit/testlib.h"

enum { N = 1024 };

typedef struct {
    Backend* be;
    float* dev;        // N floats of backend memory
    float host[N];
} Ctx;

typedef void (*Action)(Ctx* c);

// Runs one case in a fresh process (fence_check CASE: exec, not a bare fork, since OpenMP's threads do not
// survive a fork); returns its wait status.
static int in_child(const char* self, const char* name) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork: %s", strerror(errno));
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);   // the child's one-line errors are expected
        if (devnull >= 0) dup2(devnull, STDERR_FILENO);
        struct rlimit no_core = {0, 0};   // the expected crashes leave no core files
        setrlimit(RLIMIT_CORE, &no_core);
        execl(self, self, name, (char*)NULL);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) fail("waitpid: %s", strerror(errno));
    return status;
}

static int crashed(int status) { return WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS); }
static int failed_cleanly(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 1; }

static volatile float sink;
static void host_reads(Ctx* c) { sink = c->dev[N / 2]; }
static void host_writes(Ctx* c) { c->dev[7] = 1.0f; }
static void reads_after_kernel(Ctx* c) {
    residual_forward(c->be, DT_FP32, c->dev, c->dev, c->dev, N);
    sink = c->dev[0];
}
static void reads_after_nested(Ctx* c) {   // convert between equal types calls be_copy inside itself
    convert(c->be, c->dev, DT_FP32, c->dev + N / 2, DT_FP32, N / 2);
    sink = c->dev[N - 1];
}
static void upload_from_backend(Ctx* c) { be_upload(c->be, c->dev, c->dev + 1, 4); }
static void upload_to_host(Ctx* c) { be_upload(c->be, c->host, c->host + 1, 4); }
static void download_to_backend(Ctx* c) { be_download(c->be, c->dev, c->dev + 1, 4); }
static void copy_from_host(Ctx* c) { be_copy(c->be, c->dev, c->host, 4); }
static void upload_source_changed(Ctx* c) {   // the host rewrites a buffer its upload may still be reading
    BeEvent* ev = be_event_create(c->be);
    be_upload_async(c->be, c->dev, c->host, 64, ev);
    c->host[3] = -1.0f;
    be_event_synchronize(c->be, ev);
}
static void download_source_changed(Ctx* c) {   // a kernel rewrites a buffer its download may still be reading
    BeEvent* ev = be_event_create(c->be);
    be_download_async(c->be, c->host, c->dev, 64, ev);
    residual_forward(c->be, DT_FP32, c->dev, c->dev, c->dev, 16);
    be_event_synchronize(c->be, ev);
}
static void download_waited_first(Ctx* c) {   // the same, with the main stream waiting for the copy first: no race
    BeEvent* ev = be_event_create(c->be);
    be_download_async(c->be, c->host, c->dev, 64, ev);
    be_stream_wait(c->be, ev);
    residual_forward(c->be, DT_FP32, c->dev, c->dev, c->dev, 16);
    be_event_synchronize(c->be, ev);
}
static void upload_destination_written(Ctx* c) {   // a kernel writes where an upload in flight will land
    BeEvent* ev = be_event_create(c->be);
    be_upload_async(c->be, c->dev, c->host, 64, ev);
    be_memset0(c->be, c->dev + 8, 4);
    be_event_synchronize(c->be, ev);
}
static void uploads_in_order(Ctx* c) {   // two uploads to one place on one stream, waited for one at a time: no race
    BeEvent* first = be_event_create(c->be);
    BeEvent* second = be_event_create(c->be);
    be_upload_async(c->be, c->dev, c->host, 64, first);
    be_upload_async(c->be, c->dev + 8, c->host + 100, 64, second);
    be_event_synchronize(c->be, first);
    be_event_synchronize(c->be, second);
    float back[24];
    be_download(c->be, back, c->dev, sizeof back);
    if (back[0] != 0.0f || back[8] != 100.0f || back[23] != 115.0f) fail("the second upload did not land last");
}
static void upload_reused_after_stream_wait(Ctx* c) {   // the main stream's wait does not free the host's buffer
    BeEvent* ev = be_event_create(c->be);
    be_upload_async(c->be, c->dev, c->host, 64, ev);
    be_stream_wait(c->be, ev);
    c->host[0] = -1.0f;
    be_event_synchronize(c->be, ev);
}
// A download the main stream has waited for is not yet the host's: poison until the host waits, then the data.
static void download_hidden_until_host_waits(Ctx* c) {
    BeEvent* ev = be_event_create(c->be);
    float* dst = c->host + 512;
    be_download_async(c->be, dst, c->dev, 64, ev);
    be_stream_wait(c->be, ev);
    be_memset0(c->be, c->dev, 64);   // the main stream may now reuse the source
    unsigned char poison[64];
    memset(poison, 0xff, sizeof poison);
    if (memcmp(dst, poison, sizeof poison) != 0) fail("the host saw the download before waiting for it");
    be_event_synchronize(c->be, ev);
    for (int i = 0; i < 16; i++)
        if (dst[i] != (float)i) fail("element %d is %g after the host's wait, not %d", i, dst[i], i);
}
static void kernel_given_host_memory(Ctx* c) { gelu_forward(c->be, DT_FP32, c->dev, c->host, 4); }
static void later_allocation(Ctx* c) {   // memory allocated after the first is fenced too
    float* second = (float*)be_malloc(c->be, 3 * sizeof(float));
    sink = second[0];
}
static void async_upload_to_host(Ctx* c) {
    BeEvent* ev = be_event_create(c->be);
    be_upload_async(c->be, c->host, c->host + 1, 4, ev);
}

static const struct {
    const char* name;
    Action act;
} CASES[] = {
    {"host_reads", host_reads}, {"host_writes", host_writes}, {"reads_after_kernel", reads_after_kernel},
    {"reads_after_nested", reads_after_nested}, {"upload_from_backend", upload_from_backend},
    {"upload_to_host", upload_to_host}, {"download_to_backend", download_to_backend}, {"copy_from_host", copy_from_host},
    {"async_upload_to_host", async_upload_to_host}, {"later_allocation", later_allocation},
    {"kernel_given_host_memory", kernel_given_host_memory}, {"upload_source_changed", upload_source_changed},
    {"download_source_changed", download_source_changed}, {"download_waited_first", download_waited_first},
    {"upload_destination_written", upload_destination_written}, {"uploads_in_order", uploads_in_order},
    {"upload_reused_after_stream_wait", upload_reused_after_stream_wait},
    {"download_hidden_until_host_waits", download_hidden_until_host_waits},
};

static void setup(Ctx* c) {
    c->be = backend_create(0);
    c->dev = (float*)be_malloc(c->be, N * sizeof(float));
    for (int i = 0; i < N; i++) c->host[i] = (float)i;
    be_upload(c->be, c->dev, c->host, sizeof c->host);
}

int main(int argc, char** argv) {
    Ctx c;
    setup(&c);
    if (argc == 2) {   // one case, in the child
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
            if (!strcmp(argv[1], CASES[i].name)) CASES[i].act(&c);
        return 0;
    }
    TestStats st = {0, 0};
    residual_forward(c.be, DT_FP32, c.dev, c.dev, c.dev, N);   // doubles each element
    float back[N];
    be_download(c.be, back, c.dev, sizeof back);
    int same = 1;
    for (int i = 0; i < N; i++) same &= back[i] == 2.0f * (float)i;
    check_true(&st, "fence_round_trip_and_kernel", same);
    check_true(&st, "fence_reports_gpu", backend_is_gpu(c.be) && !strcmp(backend_device_name(c.be), "cpu (fenced)"));
    const char* self = "/proc/self/exe";
    check_true(&st, "fence_host_read_crashes", crashed(in_child(self, "host_reads")));
    check_true(&st, "fence_host_write_crashes", crashed(in_child(self, "host_writes")));
    check_true(&st, "fence_up_after_kernel", crashed(in_child(self, "reads_after_kernel")));
    check_true(&st, "fence_up_after_nested_call", crashed(in_child(self, "reads_after_nested")));
    check_true(&st, "fence_later_allocation", crashed(in_child(self, "later_allocation")));
    check_true(&st, "fence_upload_source_checked", failed_cleanly(in_child(self, "upload_from_backend")));
    check_true(&st, "fence_upload_destination_checked", failed_cleanly(in_child(self, "upload_to_host")));
    check_true(&st, "fence_download_destination_checked", failed_cleanly(in_child(self, "download_to_backend")));
    check_true(&st, "fence_copy_source_checked", failed_cleanly(in_child(self, "copy_from_host")));
    check_true(&st, "fence_async_upload_checked", failed_cleanly(in_child(self, "async_upload_to_host")));
    check_true(&st, "fence_kernel_pointers_checked", failed_cleanly(in_child(self, "kernel_given_host_memory")));
    check_true(&st, "fence_upload_source_race", failed_cleanly(in_child(self, "upload_source_changed")));
    check_true(&st, "fence_download_source_race", failed_cleanly(in_child(self, "download_source_changed")));
    check_true(&st, "fence_upload_destination_race", failed_cleanly(in_child(self, "upload_destination_written")));
    check_true(&st, "fence_upload_source_held_until_host_waits", failed_cleanly(in_child(self, "upload_reused_after_stream_wait")));
    int hidden = in_child(self, "download_hidden_until_host_waits");
    check_true(&st, "fence_download_hidden_until_host_waits", WIFEXITED(hidden) && WEXITSTATUS(hidden) == 0);
    int ordered = in_child(self, "uploads_in_order");
    check_true(&st, "fence_same_stream_uploads_no_race", WIFEXITED(ordered) && WEXITSTATUS(ordered) == 0);
    int waited = in_child(self, "download_waited_first");
    check_true(&st, "fence_download_waited_no_race", WIFEXITED(waited) && WEXITSTATUS(waited) == 0);
    int plain = in_child(self, "no_such_case");   // the children run the case they are given, nothing else
    check_true(&st, "fence_child_runs_its_case", WIFEXITED(plain) && WEXITSTATUS(plain) == 0);
    be_free(c.be, c.dev);
    backend_destroy(c.be);
    return test_exit(&st);
}
