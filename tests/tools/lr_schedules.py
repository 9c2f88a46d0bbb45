#!/usr/bin/env python3
"""The learning-rate schedules of -k, written from their sources' definitions (DeepSpeed's WarmupLR,
WarmupDecayLR and OneCycle in deepspeed/runtime/lr_schedules.py; Hugging Face's cosine_with_restarts and
polynomial decay in transformers' optimization.py; warmup-stable-decay as docs/flags.md states it), checked
against a run's log.jsonl (tests/system/t_lr_schedules.sh).

    lr_schedules.py LOG.jsonl STEPS FLAG VALUE [FLAG VALUE ...]

FLAG VALUE are the run's schedule flags (-l -u -q -k and -k's options; the trainer's defaults otherwise) and
STEPS its -x. Every logged step's "lr" must be the schedule's value rounded to float32, and under -k onecycle
with momentum cycling its "beta1" likewise; every step 0..STEPS-1 must be logged once. Prints "ok" or the
first difference.
"""
import json
import math
import sys

import numpy as np

DEFAULTS = {"-l": 3e-4, "-u": 0, "-q": 1.0, "-k": "cosine", "-wsd-decay": 0.2, "-wsd-shape": "linear",
            "-warmup-type": "log", "-warmup-min-lr": 0.0, "-cycle-min-lr": 0.0, "-cycle-first": 2000,
            "-cycle-second": 0, "-decay-step": 0, "-decay-lr-rate": 0.0, "-cycle-mom": 1, "-cycle-min-mom": 0.8,
            "-cycle-max-mom": 0.9, "-decay-mom-rate": 0.0, "-cycles": 1, "-power": 1.0, "-lr-end": 1e-7,
            "-beta1": 0.9}


def f32(x):
    return float(np.float32(x))


class Schedule:
    def __init__(self, flags, steps):
        o = dict(DEFAULTS)
        for k, v in flags.items():
            o[k] = type(DEFAULTS[k])(v) if not isinstance(DEFAULTS[k], float) else float(v)
        # The trainer holds its float flags as float32.
        self.o = {k: f32(v) if isinstance(v, float) else v for k, v in o.items()}
        self.x = steps

    def lr(self, s):
        return getattr(self, self.o["-k"].replace("-", "_"))(s)

    # The trainer's own warm-up for cosine, linear, constant and wsd: float32 arithmetic, (s+1)/u of -l.
    def warm(self, s):
        return np.float32(self.o["-l"]) * np.float32(s + 1) / np.float32(self.o["-u"])

    def constant(self, s):
        return self.warm(s) if s < self.o["-u"] else self.o["-l"]

    def decayed(self, s, shape):
        l, u, q = self.o["-l"], self.o["-u"], self.o["-q"]
        if s < u:
            return self.warm(s)
        frac = (s - u) / max(1, self.x - u)
        return l * q + (l - l * q) * shape(frac)

    def cosine(self, s):
        return self.decayed(s, lambda frac: 0.5 * (1 + math.cos(math.pi * frac)))

    def linear(self, s):
        return self.decayed(s, lambda frac: 1 - frac)

    def wsd(self, s):
        l, u, q = self.o["-l"], self.o["-u"], self.o["-q"]
        if s < u:
            return self.warm(s)
        d = max(1, int(math.floor(self.o["-wsd-decay"] * self.x + 0.5)))
        if s < self.x - d:
            return l
        p = (s - (self.x - d) + 1) / d
        left = 1 - p if self.o["-wsd-shape"] == "linear" else 1 - math.sqrt(p)
        return l * q + (l - l * q) * left

    # DeepSpeed's WarmupLR and WarmupDecayLR: the value at last_batch_iteration s.
    def warmup(self, s, decay=False):
        lo, hi = self.o["-warmup-min-lr"], self.o["-l"]
        w = max(2, self.o["-u"])
        if s < w:
            gamma = math.log(s + 1) / math.log(w) if self.o["-warmup-type"] == "log" else s / w
        elif decay:
            gamma = max(0.0, (self.x - s) / max(1.0, self.x - w))
        else:
            gamma = 1.0
        return lo + (hi - lo) * gamma

    def warmup_decay(self, s):
        return self.warmup(s, decay=True)

    # DeepSpeed's OneCycle: step s trains with what get_lr() gives after s calls of step(), i.e. at
    # last_batch_iteration s-1 (the constructor's cycle_min_lr for step 0).
    def onecycle_phase(self, s):
        first = self.o["-cycle-first"]
        second = self.o["-cycle-second"] or first
        total = first + second
        it = s - 1
        if it < total:
            b = it + 1
            cycle = math.floor(1 + b / total)
            x = 1.0 + b / total - cycle
            ratio = first / total
            return (x / ratio if x <= ratio else (x - 1) / (ratio - 1)), None
        return None, it - total + 1

    def onecycle(self, s):
        scale, after = self.onecycle_phase(s)
        lo, hi = self.o["-cycle-min-lr"], self.o["-l"]
        if scale is not None:
            return lo + (hi - lo) * scale
        if self.o["-decay-step"] == 0 or self.o["-decay-lr-rate"] == 0:
            return lo
        return lo / (1 + self.o["-decay-lr-rate"] * after / self.o["-decay-step"])

    def beta1(self, s):
        if self.o["-k"] != "onecycle" or not self.o["-cycle-mom"]:
            return None
        scale, after = self.onecycle_phase(s)
        lo, hi = self.o["-cycle-min-mom"], self.o["-cycle-max-mom"]
        if scale is not None:
            return hi - (hi - lo) * scale
        if self.o["-decay-step"] == 0 or self.o["-decay-mom-rate"] == 0:
            return hi
        return hi * (1 + self.o["-decay-mom-rate"] * after / self.o["-decay-step"])

    # Hugging Face: LambdaLR's factor at step s times -l.
    def hf_warm(self, s):
        return s / max(1, self.o["-u"])

    def cosine_restarts(self, s):
        u = self.o["-u"]
        if s < u:
            return self.o["-l"] * self.hf_warm(s)
        progress = (s - u) / max(1, self.x - u)
        if progress >= 1.0:
            return 0.0
        return self.o["-l"] * max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((self.o["-cycles"] * progress) % 1.0))))

    def polynomial(self, s):
        u, init, end = self.o["-u"], self.o["-l"], self.o["-lr-end"]
        if s < u:
            return init * self.hf_warm(s)
        if s > self.x:
            return end
        remaining = 1 - (s - u) / (self.x - u)
        return ((init - end) * remaining ** self.o["-power"] + end) / init * init


def main():
    log, steps = sys.argv[1], int(sys.argv[2])
    rest = sys.argv[3:]
    sched = Schedule(dict(zip(rest[::2], rest[1::2])), steps)
    seen = {}
    for line in open(log):
        rec = json.loads(line)
        if "lr" in rec:
            if rec["step"] in seen:
                print("step %d logged twice" % rec["step"])
                return
            seen[rec["step"]] = rec
    if sorted(seen) != list(range(steps)):
        print("logged steps %s, not 0..%d" % (sorted(seen)[:5], steps - 1))
        return
    for s in range(steps):
        want = f32(sched.lr(s))
        if f32(seen[s]["lr"]) != want:
            print("step %d: lr %r, the formula %r" % (s, seen[s]["lr"], want))
            return
        b = sched.beta1(s)
        if (b is None) != ("beta1" not in seen[s]) or (b is not None and f32(seen[s]["beta1"]) != f32(b)):
            print("step %d: beta1 %r, the formula %r" % (s, seen[s].get("beta1"), b))
            return
    print("ok")


if __name__ == "__main__":
    main()
