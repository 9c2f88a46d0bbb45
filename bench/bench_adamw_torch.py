#!/usr/bin/python3
"""PyTorch's CPU AdamW (foreach) on the same number of fp32 parameters as bench_adamw, for comparison.
  bench_adamw_torch.py [N_PARAMS] [THREADS]     prints the best of 5 steps after one warm-up, and a JSON line
"""
import json
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 124475904
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else torch.get_num_threads())
p = torch.nn.Parameter(torch.full((n,), 0.1))
p.grad = torch.full((n,), 0.01)
opt = torch.optim.AdamW([p], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=True)
times = []
for step in range(6):
    t0 = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t0)
best = min(times[1:])
print("torch %s AdamW(foreach): %d params, %d threads: best %.3f s" % (torch.__version__, n, torch.get_num_threads(), best))
print(json.dumps({"params": n, "threads": torch.get_num_threads(), "torch_adamw_s": round(best, 4), "torch": torch.__version__}))
