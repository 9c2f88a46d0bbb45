// delayed_update.h: -dpu, ZeRO-Offload's delayed parameter update. The host's optimizer step for the
// gradients of step s runs in a host thread while the device computes step s + 1, whose forward and
// backward therefore use the parameters before that update: each update lands one step late, and the host
// step leaves the critical path. Same arithmetic as optimizer_step (optimizer_host_spans, the same arguments
// and noise), on the gradients as they were at step s: the step copies them to host memory before the next
// micro-step overwrites them, and the new working copy is written to host memory until it is published.
#pragma once
#include "core/zero/model_state.h"
#include "core/zero/optimizer.h"

typedef struct DelayedUpdate DelayedUpdate;

// ms must have pending buffers (ModelState.pending); stays in use until delayed_update_destroy.
DelayedUpdate* delayed_update_create(const ModelState* ms);
void delayed_update_destroy(DelayedUpdate* d);   // waits for an update in flight and drops it

// Copies the reduced gradients to host memory and starts step o's update on them in a host thread. At
// most one update is in flight: finish the last one first.
void delayed_update_start(DelayedUpdate* d, Backend* be, const OptimizerStep* o, float grad_scale);
// Waits for the update in flight, if any, and copies the working copy it computed to where the walk reads
// it. Returns whether one was published: the caller then redistributes the parameters (zero_after_update).
int delayed_update_finish(DelayedUpdate* d, Backend* be);
// How long the host thread of the last update to land took (seconds).
double delayed_update_seconds(const DelayedUpdate* d);
