#!/usr/bin/env python3
"""Checks a run directory's monitors against its log.jsonl (tests/system/t_monitors.sh).

    monitors_check.py RUN_DIR EVENTS_JSON

EVENTS_JSON is tests/tools/tfevents_read.js's reading of RUN_DIR/tb's event file. The scalars of log.jsonl are
found here from the rule docs/operations.md states (every number of a record but "step"; nested objects'
numbers tagged with the keys on the way joined by '/'; a record with "rank" prefixed "rank<r>/"; arrays,
non-numbers and the "layout" record left out), and must be exactly:
- the event file's scalars, each the log's number rounded to float32, in the log's order, after a first record
  holding file_version "brain.Event:2";
- the CSV files' rows: RUN_DIR/csv/<tag, '/' made '_'>.csv, header "step,<last part of the tag>", then
  "step,number" with the number's text as the log has it; no other CSV file.
No (step, tag) may appear twice. Prints "ok" when all hold, else the first problem.
"""
import json
import os
import sys

import numpy as np


class Number:
    def __init__(self, text):
        self.text = text


def log_scalars(path):
    out = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line, parse_float=Number, parse_int=Number)   # the numbers' text as written
            if "step" not in rec or "layout" in rec:
                continue
            prefix = "rank%s/" % rec["rank"].text if "rank" in rec else ""
            walk(int(rec["step"].text), prefix, {k: v for k, v in rec.items() if k not in ("step", "rank")}, out)
    return out


def walk(step, prefix, obj, out):
    for key, value in obj.items():
        if isinstance(value, dict):
            walk(step, prefix + key + "/", value, out)
        elif isinstance(value, Number):
            out.append((step, prefix + key, value.text))


def check(run_dir, events):
    expected = log_scalars(os.path.join(run_dir, "log.jsonl"))
    if not expected:
        return "log.jsonl has no scalars"
    keys = [(s, t) for s, t, _ in expected]
    if len(set(keys)) != len(keys):
        return "log.jsonl repeats a (step, tag)"
    if events["version"] != "brain.Event:2" or events["first_step"]:
        return "the first record is not file_version brain.Event:2 without a step: %r" % events["version"]
    want = [[s, t, float(np.float32(float(v)))] for s, t, v in expected]
    if events["scalars"] != want:
        bad = next(i for i in range(min(len(want), len(events["scalars"])) + 1)
                   if i >= len(want) or i >= len(events["scalars"]) or want[i] != events["scalars"][i])
        return "event scalar %d: %s, log %s (%d vs %d scalars)" % (
            bad, events["scalars"][bad] if bad < len(events["scalars"]) else None, want[bad] if bad < len(want) else None,
            len(events["scalars"]), len(want))
    return check_csv(os.path.join(run_dir, "csv"), expected)


def check_csv(csv_dir, expected):
    rows = {}
    for step, tag, text in expected:
        rows.setdefault(tag, []).append("%d,%s" % (step, text))
    files = {tag.replace("/", "_").replace(" ", "_") + ".csv": tag for tag in rows}
    present = sorted(f for f in os.listdir(csv_dir) if f.endswith(".csv"))
    if present != sorted(files):
        return "CSV files %s, expected %s" % (sorted(set(present) ^ set(files)), "the log's tags")
    for name, tag in files.items():
        with open(os.path.join(csv_dir, name)) as f:
            lines = f.read().splitlines()
        want = ["step," + tag.split("/")[-1]] + rows[tag]
        if lines != want:
            return "%s: %s, expected %s" % (name, lines[:4], want[:4])
    return None


def main():
    run_dir, events_json = sys.argv[1:3]
    with open(events_json) as f:
        events = json.load(f)
    problem = check(run_dir, events)
    print(problem or "ok")


if __name__ == "__main__":
    main()
