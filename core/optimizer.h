// optimizer.h: the step after the gradients are in: global norm, clipping, AdamW over the tensors.
#pragma once
#include "gpt.h"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_clip;   // 0: off
    int step;          // 0-based step being taken
    uint64_t seed;     // run seed; the rounding noise of step s is seeded from (seed, s)
} OptimizerStep;

// Global L2 norm of the gradients. acc: one float of backend scratch.
double grad_global_norm(GPT* g, Backend* be, float* acc);
// Scale applied to the gradients: clip / norm when the norm exceeds the clip, else 1.
float grad_clip_scale(double norm, float clip);
// AdamW on every tensor (weight decay on the 2-D ones), gradients multiplied by grad_scale.
void adamw_step(GPT* g, Backend* be, const OptimizerStep* o, float grad_scale);
