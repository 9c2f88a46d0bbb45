// loss_scale.h: dynamic loss scaling for fp16 (and a fixed scale of 1 otherwise), as a small state machine.
// The loss gradient is multiplied by `scale` so small fp16 gradients do not flush to zero; the optimizer
// divides it back out. A step whose gradients overflowed (a non-finite global norm: the same verdict on
// every rank, since the norm is all-reduced) is skipped. After `hysteresis` overflows the scale halves (not
// below `min_scale`); after `window` clean steps in a row it doubles.
#pragma once

typedef struct {
    int dynamic;          // 0: the scale stays 1 (fp32, bf16)
    float scale;
    int window;           // clean steps before the scale doubles (1000)
    int hysteresis;       // overflows tolerated before the scale halves (2)
    float min_scale;      // (1)
    int clean_steps;      // since the last overflow
    int overflows_left;   // until the next halving
} LossScaler;

LossScaler loss_scaler_init(int dynamic, float initial_scale);
// Records one step: overflow != 0 means its gradients were not finite. Updates the scale.
void loss_scaler_update(LossScaler* s, int overflow);
