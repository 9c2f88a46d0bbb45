// phase_timer.h: wall-clock per phase of a training step, like DeepSpeed's wall_clock_breakdown. Only on
// breakdown steps (-lb) does a mark synchronize the device, so other steps keep their asynchrony. The
// executor marks phases; report.h prints and logs them.
#pragma once
#include "core/util/disk_io.h"
#include "kernels/kernels.h"

double now_seconds(void);   // monotonic

// PHASE_WAIT: blocked receiving from another pipeline stage; a send's copy goes to the phase after it.
// PHASE_UPDATE_WAIT (-dpu): blocked until the last step's host update, which ran behind this step, landed.
typedef enum { PHASE_DATA, PHASE_FORWARD, PHASE_BACKWARD, PHASE_WAIT, PHASE_COMM, PHASE_OPTIMIZER, PHASE_UPDATE_WAIT, NUM_PHASES } Phase;
typedef struct {
    int on;
    double last;
    double seconds[NUM_PHASES];
    double overlapped;   // -dpu: how long the host update that landed in this step ran, behind the phases above
    double host_copies;  // -offload 2: time inside the forward and backward the launch thread spent on moving
                         // pieces to and from the host: uploads, and waits for the gradient landing
                         // (zero_host_copy_seconds); part of those phases
    double quantize;     // -qg: time the gradient reduction spent quantizing and dequantizing (zero_quantize_seconds);
                         // part of the backward
    DiskTimes disk;      // -nvme: the optimizer's pass over the state on disk (behind the step with -dpu)
} PhaseTimer;
void phase_mark(PhaseTimer* pt, Backend* be, Phase p);   // the time since the last mark goes to phase p
const char* phase_name(Phase p);                          // as logged: "data", "forward", ...
