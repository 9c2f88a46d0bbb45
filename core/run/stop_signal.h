// stop_signal.h: preemption (SIGTERM from a scheduler, SIGINT from a terminal). During start-up both keep
// their default action, so a trainer stuck loading ends at once. From the training loop on, the first one is
// caught by a handler whose only work is putting both signals back to their default (sigaction is
// async-signal-safe): the disposition itself then says "stop requested", so there is no global flag, and a
// second signal of either kind ends the process at once, mid-step or mid-checkpoint. Dispositions are per
// process, so threads of MPI and OpenMP need nothing. A signal ignored when the trainer started (nohup, or
// SIGINT for a background job of a script) stays ignored.
#pragma once

// Catches SIGTERM and SIGINT as above; a one-line error when sigaction fails.
void stop_signals_catch(void);
// This rank's own view (1: a signal came); the ranks act on the max over the world, so that they all stop at
// the same point.
int stop_signal_seen(void);
