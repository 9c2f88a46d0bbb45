// lr_range.h: -lr-range MIN,MAX,STEPS, DeepSpeed's LRRangeTest (lr_range_test_min_lr MIN, step size 1,
// continuous, step rate (MAX/MIN - 1)/(STEPS - 1)): the learning rate of step s is MIN + (MAX - MIN) s/(STEPS-1),
// rising every step (config_lr_at). The run stops after the step whose loss diverges: not finite, or above
// LR_RANGE_DIVERGED times the lowest loss of the steps before it. Its suggested peak learning rate is a tenth
// of the lr where the smoothed loss is lowest: the bias-corrected exponential average a_s = 0.9 a_(s-1) +
// 0.1 loss_s, smoothed_s = a_s / (1 - 0.9^(s+1)), over the steps before the stop (the diverged one left out).
#pragma once
#include "core/util/logger.h"

#define LR_RANGE_DIVERGED 4.0
#define LR_RANGE_SMOOTHING 0.9

typedef struct {
    float* lr;
    double* loss;
    int n, cap;
    int diverged;   // the last step recorded diverged
} LrRangeTest;

// Records step's lr and loss (steps in order from 0); 1 when the loss diverged and the test stops here.
int lr_range_record(LrRangeTest* t, float lr, double loss);
// Prints (print: rank 0) loss and smoothed loss against lr and the suggestion, logs {"step": the last step,
// "lr_range": {...}}, and frees the test.
void lr_range_finish(LrRangeTest* t, Logger* log, int print);
