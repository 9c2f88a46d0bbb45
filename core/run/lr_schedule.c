// lr_schedule.c: -k's learning rate per step, and AdamW's beta1 per step under onecycle (config.h).
// Step s is 0-based; max_steps is the run's -x once resolved. The formulas:
//   cosine, linear, constant: -u warm-up steps at l (s+1)/u, then down to l*q (cosine or linear) or flat.
//   wsd: that warm-up, flat at l, then the last D = round(wsd_decay * max_steps) steps (at least 1) decay to
//     l*q: with p = (s - (max_steps - D) + 1) / D, linear l*q + (l - l*q)(1 - p), 1-sqrt l*q + (l - l*q)(1 - sqrt p).
//   warmup, warmup-decay (DeepSpeed's WarmupLR, WarmupDecayLR at last_batch_iteration s): W = max(2, u);
//     below W, gamma = ln(s+1)/ln(W) (log) or s/W (linear); then 1 (warmup) or max(0, (max_steps - s) /
//     max(1, max_steps - W)) (warmup-decay); lr = warmup_min_lr + (l - warmup_min_lr) gamma.
//   onecycle (DeepSpeed's OneCycle; step s is trained after s scheduler steps, so its batch index b = s):
//     total = first + second; for s <= total: x = b/total - floor(b/total), f = x/ratio when x <= ratio (ratio =
//     first/total) else (x-1)/(ratio-1); lr = cycle_min_lr + (l - cycle_min_lr) f, beta1 = max_mom - (max_mom
//     - min_mom) f. After: d = s - total; with decay_step > 0 and a rate, lr = cycle_min_lr / (1 + decay_lr_rate
//     d/decay_step), beta1 = max_mom (1 + decay_mom_rate d/decay_step); else cycle_min_lr and max_mom.
//   cosine-restarts (Hugging Face's cosine_with_restarts): below u, l s/max(1,u); then with p = (s-u) /
//     max(1, max_steps-u): 0 once p >= 1, else l max(0, (1 + cos(pi ((cycles p) mod 1)))/2).
//   polynomial (Hugging Face's polynomial decay): below u, l s/max(1,u); past max_steps lr_end; else lr_end +
//     (l - lr_end) (1 - (s-u)/(max_steps-u))^power.
#include <math.h>

#include "base/common.h"
#include "core/run/config.h"

static float original(const Config* c, int s, int max_steps) {
    if (s < c->warmup) return c->lr * (float)(s + 1) / (float)c->warmup;
    double frac = (double)(s - c->warmup) / (double)(max_steps - c->warmup > 1 ? max_steps - c->warmup : 1);
    double lr_min = (double)c->lr * c->final_lr_frac;
    switch (c->schedule) {
        case LR_COSINE: return (float)(lr_min + 0.5 * (1.0 + cos(M_PI * frac)) * (c->lr - lr_min));
        case LR_LINEAR: return (float)(c->lr - frac * (c->lr - lr_min));
        default: return c->lr;
    }
}

static double wsd(const Config* c, int s, int max_steps) {
    if (s < c->warmup) return c->lr * (float)(s + 1) / (float)c->warmup;
    int decay = (int)lround(c->sched.wsd_decay * (double)max_steps);
    if (decay < 1) decay = 1;
    int start = max_steps - decay;
    if (s < start) return c->lr;
    double p = (double)(s - start + 1) / decay, lr_min = (double)c->lr * c->final_lr_frac;
    double left = c->sched.wsd_shape == WSD_LINEAR ? 1.0 - p : 1.0 - sqrt(p);
    return lr_min + (c->lr - lr_min) * left;
}

static double deepspeed_warmup(const Config* c, int s, int max_steps) {
    int w = c->warmup > 2 ? c->warmup : 2;
    double gamma;
    if (s < w) gamma = c->sched.warmup_type == WARMUP_LOG ? log((double)s + 1.0) / log((double)w) : (double)s / w;
    else if (c->schedule == LR_WARMUP) gamma = 1.0;
    else gamma = fmax(0.0, (double)(max_steps - s) / fmax(1.0, (double)(max_steps - w)));
    return c->sched.warmup_min_lr + ((double)c->lr - c->sched.warmup_min_lr) * gamma;
}

// OneCycle's position: the cycle's scale factor f (0 at the ends, 1 at the peak) while s <= total, else -1 with
// the steps since the cycle in *after.
static double onecycle_factor(const Config* c, int s, double* after) {
    double first = c->sched.cycle_first, second = c->sched.cycle_second ? c->sched.cycle_second : first;
    double total = first + second, ratio = first / total;
    if (s > total) {
        *after = s - total;
        return -1.0;
    }
    double x = (double)s / total - floor((double)s / total);
    return x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
}

static double onecycle(const Config* c, int s) {
    double after = 0.0, f = onecycle_factor(c, s, &after);
    if (f >= 0.0) return c->sched.cycle_min_lr + ((double)c->lr - c->sched.cycle_min_lr) * f;
    if (c->sched.decay_step == 0 || c->sched.decay_lr_rate == 0.0f) return c->sched.cycle_min_lr;
    return c->sched.cycle_min_lr / (1.0 + c->sched.decay_lr_rate * after / c->sched.decay_step);
}

static double hf_warmup(const Config* c, int s) { return (double)c->lr * ((double)s / (c->warmup > 1 ? c->warmup : 1)); }

static double cosine_restarts(const Config* c, int s, int max_steps) {
    if (s < c->warmup) return hf_warmup(c, s);
    double p = (double)(s - c->warmup) / (max_steps - c->warmup > 1 ? max_steps - c->warmup : 1);
    if (p >= 1.0) return 0.0;
    return c->lr * fmax(0.0, 0.5 * (1.0 + cos(M_PI * fmod(c->sched.cycles * p, 1.0))));
}

static double polynomial(const Config* c, int s, int max_steps) {
    if (s < c->warmup) return hf_warmup(c, s);
    if (s > max_steps) return c->sched.lr_end;
    double left = 1.0 - (double)(s - c->warmup) / (max_steps - c->warmup);
    return c->sched.lr_end + ((double)c->lr - c->sched.lr_end) * pow(left, c->sched.power);
}

float config_lr_at(const Config* c, int step, int max_steps) {
    if (c->range_test.steps)   // -lr-range (lr_range.h)
        return (float)(c->range_test.min + ((double)c->range_test.max - c->range_test.min) * step / (c->range_test.steps - 1));
    switch (c->schedule) {
        case LR_WSD: return (float)wsd(c, step, max_steps);
        case LR_WARMUP: case LR_WARMUP_DECAY: return (float)deepspeed_warmup(c, step, max_steps);
        case LR_ONECYCLE: return (float)onecycle(c, step);
        case LR_COSINE_RESTARTS: return (float)cosine_restarts(c, step, max_steps);
        case LR_POLYNOMIAL: return (float)polynomial(c, step, max_steps);
        default: return original(c, step, max_steps);
    }
}

float config_beta1_at(const Config* c, int step, int max_steps) {
    (void)max_steps;   // OneCycle's momentum follows its own cycle, not the run's length
    if (c->schedule != LR_ONECYCLE || !c->sched.cycle_momentum) return c->adam_beta1;
    double after = 0.0, f = onecycle_factor(c, step, &after);
    const LrOptions* o = &c->sched;
    double beta1 = f >= 0.0                                     ? o->cycle_max_mom - (o->cycle_max_mom - o->cycle_min_mom) * f
                   : o->decay_step == 0 || o->decay_mom_rate == 0.0f ? o->cycle_max_mom
                                                               : o->cycle_max_mom * (1.0 + o->decay_mom_rate * after / o->decay_step);
    if (!(beta1 < 1.0)) fail("-k onecycle: -decay-mom-rate %g raises beta1 to %g at step %d (it must stay below 1)", o->decay_mom_rate, beta1, step);
    return (float)beta1;
}
