// host_groups.c: see host_groups.h.
#include "core/comm/host_groups.h"

#include <stdlib.h>

#include "base/common.h"

// GPT_RANKS_PER_HOST, or 0 when unset.
static int pretended_per_host(int size) {
    const char* s = getenv("GPT_RANKS_PER_HOST");
    if (!s || !*s) return 0;
    char* end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1 || v > size || size % v)
        fail("GPT_RANKS_PER_HOST=%s: the ranks per pretended host must divide the group of %d ranks", s, size);
    return (int)v;
}

// The ranks per host when every host holds the same number of consecutive ranks; one line otherwise. Every
// rank sees the same hosts[], so every rank decides alike.
static int real_per_host(const long long* hosts, int size) {
    int per = 1;
    while (per < size && hosts[per] == hosts[0]) per++;
    for (int r = 0; r < size; r++) {
        int same_as_first = hosts[r] == hosts[r - r % per];
        int new_host = r % per || r == 0 || hosts[r] != hosts[r - 1];
        if (size % per || !same_as_first || !new_host)
            fail("-qg 1 groups the data-parallel ranks by host: each host must hold the same number of consecutive "
                 "data-parallel ranks (rank %d of %d breaks %d per host)", r, size, per);
    }
    return per;
}

HostGroups host_groups_split(Comm* group, int host) {
    int size = comm_size(group), rank = comm_rank(group);
    int per = pretended_per_host(size);
    if (!per) {
        long long* hosts = (long long*)xmalloc((size_t)size * sizeof(long long));
        for (int r = 0; r < size; r++) hosts[r] = r == rank ? host : -1;
        comm_allreduce_host_max_i64(group, hosts, size);
        per = real_per_host(hosts, size);
        free(hosts);
    }
    HostGroups h = {.per_host = per, .hosts = size / per};
    h.intra = comm_split(group, rank / per, rank % per);
    h.inter = comm_split(group, rank % per, rank / per);
    return h;
}

void host_groups_free(HostGroups* h) {
    comm_free(h->intra);
    comm_free(h->inter);
    *h = (HostGroups){0};
}
