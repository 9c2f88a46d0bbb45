// test_report_comm.c: the run log's comm_bytes record (core/run/report.c) lists the all-to-all only once a rank
// has sent by it, so the records of runs without it keep their keys. A record needs 2+ ranks
// (tests/system/t_comm.sh runs this on 3); alone, the check is that nothing is logged.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "core/comm/grid.h"
#include "core/run/report.h"
#include "tests/unit/testlib.h"

// The comm_bytes record report_comm writes for one step (rank 0's log), after an all-reduce, or an all-to-all, on
// the world.
static void record(Comm* world, Logger* lg, int step, int alltoall, char* line, size_t cap) {
    Grid g = {.pp = 1, .dp = comm_size(world), .tp = 1, .world = world, .dp_group = world};
    float x[6] = {0};
    report_comm_reset(&g);
    if (alltoall) {
        float y[6];
        comm_alltoall(world, y, x, 6 / (size_t)comm_size(world), DT_FP32);
    } else {
        comm_allreduce_sum(world, x, 6, DT_FP32);
    }
    report_comm(lg, &g, step);
    line[0] = 0;
    if (comm_rank(world) != 0) return;
    if (fseek(lg->f, 0, SEEK_SET) != 0) fail("fseek of the test log: %s", strerror(errno));
    char buf[4096], key[32];   // the step's comm_bytes record (its link_bytes record follows it)
    snprintf(key, sizeof key, "{\"step\": %d,", step);
    while (fgets(buf, (int)sizeof buf, lg->f))
        if (!strncmp(buf, key, strlen(key)) && strstr(buf, "\"comm_bytes\"")) snprintf(line, cap, "%s", buf);
    if (fseek(lg->f, 0, SEEK_END) != 0) fail("fseek of the test log: %s", strerror(errno));
}

int main(int argc, char** argv) {
    Comm* world = comm_init_world(&argc, &argv);
    Backend* be = backend_create(comm_local_rank(world));
    comm_attach_backend(world, be);
    int rank = comm_rank(world), size = comm_size(world);
    if (size > 6 || 6 % size) fail("test_report_comm: 1, 2, 3 or 6 ranks (6 floats split into blocks)");
    Logger lg = {.f = tmpfile(), .path = "the test log"};
    if (!lg.f) fail("tmpfile: %s", strerror(errno));
    char without[4096], with[4096], want[256];
    record(world, &lg, 1, 0, without, sizeof without);
    record(world, &lg, 2, 1, with, sizeof with);
    // Each rank sends (N-1) of its N blocks of 6/N floats.
    long long sent = (long long)(size - 1) * (6 / size) * 4;
    int n = snprintf(want, sizeof want, "\"alltoall\": [");
    for (int r = 0; r < size; r++) n += snprintf(want + n, sizeof want - (size_t)n, "%s%lld", r ? ", " : "", sent);
    snprintf(want + n, sizeof want - (size_t)n, "]}}");
    TestStats st = {0};
    if (rank == 0 && size == 1) {
        check_true(&st, "report_comm_one_rank_logs_nothing", ftell(lg.f) == 0);
    } else if (rank == 0) {
        check_true(&st, "report_comm_without_alltoall_keeps_its_keys",
                   strstr(without, "\"comm_bytes\"") && strstr(without, "\"send\": [") && !strstr(without, "alltoall"));
        check_true(&st, "report_comm_lists_alltoall_once_sent", strstr(with, want) != NULL);
        if (st.failed) fprintf(stderr, "records:\n%s%s(expected %s)\n", without, with, want);
    }
    long long failed = st.failed;
    comm_allreduce_host_max_i64(world, &failed, 1);
    if (fclose(lg.f) != 0) fail("fclose of the test log: %s", strerror(errno));
    backend_destroy(be);
    comm_finalize(world);
    return failed ? 1 : 0;
}
