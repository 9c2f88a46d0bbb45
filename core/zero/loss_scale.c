// loss_scale.c: see loss_scale.h.
#include "core/zero/loss_scale.h"

LossScaler loss_scaler_init(int dynamic, float initial_scale) {
    LossScaler s = {dynamic, dynamic ? initial_scale : 1.0f, 1000, 2, 1.0f, 0, 2};
    return s;
}

void loss_scaler_update(LossScaler* s, int overflow) {
    if (!s->dynamic) return;
    if (overflow) {
        s->clean_steps = 0;
        if (--s->overflows_left > 0) return;
        s->overflows_left = s->hysteresis;
        s->scale = s->scale / 2.0f > s->min_scale ? s->scale / 2.0f : s->min_scale;
        return;
    }
    if (++s->clean_steps < s->window) return;
    s->clean_steps = 0;
    s->overflows_left = s->hysteresis;
    s->scale *= 2.0f;
}
