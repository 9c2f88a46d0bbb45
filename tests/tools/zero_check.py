#!/usr/bin/env python3
"""Checks a run's log.jsonl against the ZeRO table of docs/ARCHITECTURE.md: each rank's bytes per memory category and per
collective must equal what the stage implies for the logged layout (exact formulas, padding included).

  zero_check.py NAME LOG.jsonl [--untied]   prints "ok NAME_memory", "ok NAME_comm" or FAIL lines; exit 1 on failure

--untied: the model's LM head is its own (a Llama-family shape without "tied"), in the final unit, so the final
unit is as large as the embedding unit and shares its slots under ZeRO-2/3 (core/zero/param_slots.h).

The run must have been made without validation or sampling (-v 0 -s 0), so each step's traffic is the
training step's alone.
"""
import json
import sys


def expected_memory(lay, untied):
    P, N, x, z, U = lay["elements"], lay["ranks"], lay["dtype_bytes"], lay["zero"], lay["units"]
    block, emb, final = max(U[1:-1]), U[0], U[-1]
    # The walk's slots: two rotating ones for the blocks (and, for the gradients, a tied head's small final unit);
    # the edge units' own, one shared by the embedding and an untied head, else one each.
    grad_rotating, grad_edge = (block, max(emb, final)) if untied else (max(block, final), emb)
    param_edges = max(emb, final) if untied else emb + final
    state = P if z == 0 else P // N
    whole = N == 1  # one rank: each piece is its whole unit in place, so piece buffers alias whole ones
    alias = x == 4 and (z in (0, 3) or whole)  # fp32 params are their own master where indexed alike
    norm_acc = 4
    if z < 3:
        params = P * x
    else:
        params = state * x + 2 * block * x + param_edges * x
    if z == 0:
        grads = P * x + norm_acc
    elif z == 1:
        grads = P * x + (0 if whole else state * x) + norm_acc
    else:
        grads = 4 * state + 4 * (max(U) // N) + 2 * grad_rotating * x + grad_edge * x + norm_acc
    level = lay.get("offload", 0)
    host_grads = host_params = 0
    if level == 2 and z >= 2:  # the fp32 pieces move to the host; two landing slots (core/zero/grad_landing.h), each
        piece = max(U) // N     # one piece of the largest unit on the device (outbox) and one on the host;
        grads += 2 * x * piece - 4 * state - 4 * piece  # no fp32 piece buffer without a pipeline's tied embedding
        host_grads = 4 * state + 2 * x * piece
    if level == 2 and z == 3:  # the parameter pieces too; the walk's gathered buffers stay
        params -= state * x
        host_params = state * x
    if level:  # master and Adam on the host (never aliased there), plus the optimizer's staging
        stage = 2 * min(state, 1 << 20) * ((0 if host_grads else 4) + (0 if host_params else x))  # two buffers
        return {"params": params, "grads": grads, "master": 0, "optimizer": 0, "comm": 0, "host_state": 12 * state + stage,
                "host_grads": host_grads, "host_params": host_params}
    return {"params": params, "grads": grads, "master": 0 if alias else 4 * state, "optimizer": 8 * state, "comm": 0,
            "host_state": 0, "host_grads": 0, "host_params": 0}


def expected_comm(lay, untied):
    P, N, x, z, U, ga = lay["elements"], lay["ranks"], lay["dtype_bytes"], lay["zero"], lay["units"], lay["ga"]
    f = lambda s: s * (N - 1) // N  # ring algorithms: each rank sends (N-1)/N of the data
    exp = {"allreduce": 0, "reduce_scatter": 0, "allgather": 0, "broadcast": 0, "send": 0}
    if z == 0:
        exp["allreduce"] = 2 * f(P * x)
    elif z == 1:
        exp["reduce_scatter"], exp["allgather"] = f(P * x), f(P * x)
    elif z == 2:
        exp["reduce_scatter"], exp["allgather"] = ga * f(P * x), f(P * x)
    else:  # blocks gathered before forward and before backward; the embedding and final units once per step,
        # each kept in its slot, or once per micro-step where an untied head takes the embedding unit's slot
        exp["reduce_scatter"] = ga * f(P * x)
        exp["allgather"] = f(x * (2 * ga * sum(U[1:-1]) + (ga if untied else 1) * (U[0] + U[-1])))
    return exp


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["--untied"]):
        sys.exit("usage: zero_check.py NAME LOG.jsonl [--untied]")
    name, path, untied = sys.argv[1], sys.argv[2], sys.argv[3:] == ["--untied"]
    recs = [json.loads(l) for l in open(path) if l.strip()]
    lay = next(r["layout"] for r in recs if "layout" in r)
    mem = {r["rank"]: r["memory"] for r in recs if "memory" in r}
    failed = []
    want = expected_memory(lay, untied)
    bad = ["rank %d %s: %d bytes, expected %d" % (rank, k, m[k], v)
           for rank, m in sorted(mem.items()) for k, v in want.items() if m[k] != v]
    if len(mem) != lay["ranks"] * lay.get("tp", 1):   # every tensor rank holds its own shards, alike in size
        bad.append("memory records for %d ranks, expected %d" % (len(mem), lay["ranks"] * lay.get("tp", 1)))
    print(("ok %s_memory" % name) if not bad else "FAIL %s_memory: %s" % (name, "; ".join(bad[:4])))
    failed += bad
    if lay["ranks"] > 1:
        # With tensor parallelism the data-parallel group's own record ("dp_comm_bytes") is what ZeRO sends.
        key = "dp_comm_bytes" if any("dp_comm_bytes" in r for r in recs) else "comm_bytes"
        steps = [r for r in recs if key in r]
        want = expected_comm(lay, untied)
        bad = ["step %d %s rank %d: %d bytes, expected %d" % (r["step"], k, i, got, v)
               for r in steps for k, v in want.items() for i, got in enumerate(r[key][k]) if got != v]
        if not steps:
            bad.append("no comm_bytes records")
        print(("ok %s_comm" % name) if not bad else "FAIL %s_comm: %s" % (name, "; ".join(bad[:4])))
        failed += bad
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
