// mpi_check.h: the comm layer's check of an MPI return code (comm_mpi.c, watchdog.c), internal to the layer.
#pragma once
#include <mpi.h>
#include <stdio.h>

#include "base/common.h"

// Every MPI call's return code goes through here: anything but MPI_SUCCESS is a one-line error naming the
// call (`what`) and MPI's own words for the code, and exit 1. The communicators return their errors
// (MPI_ERRORS_RETURN) so that they get this line.
static inline void mpi_check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error code %d", rc);
    fail("%s failed: %s", what, msg);
}
