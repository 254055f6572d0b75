#!/usr/bin/env python3
"""Checks a colony trace (Chrome trace-event JSON) for consistency.

  trace_check.py TRACE.json [--lost]

Exits 0 if it holds: it parses as JSON; no two coroutine slices overlap on
one thread's lane; each coroutine's events come in a valid order (created
before it first runs, readied between a park and its next run, nothing
after its exit); the writer saw no anomalies. --lost: the trace must
report lost events, with a record of them (and then only the lanes are
checked: a coroutine's story has gaps). Prints what failed otherwise.
"""
import json
import sys


def fail(msg):
    print("trace_check: " + msg)
    sys.exit(1)


def main():
    path = sys.argv[1]
    want_lost = "--lost" in sys.argv[2:]
    with open(path) as f:
        d = json.load(f)
    od = d.get("otherData", {})
    evs = d.get("traceEvents")
    if not isinstance(evs, list) or not evs:
        fail("no traceEvents")
    # a trace that lost events cannot show every coroutine's whole story:
    # there only the lanes' consistency is checked
    if od.get("anomalies") != 0 and not want_lost:
        fail("anomalies: %r" % od.get("anomalies"))
    lost_recs = [e for e in evs if e.get("cat") == "lost"]
    if want_lost:
        if not od.get("lost_events") or not lost_recs:
            fail("expected lost events, got %r and %d records" % (od.get("lost_events"), len(lost_recs)))
        if sum(e["args"]["count"] for e in lost_recs) > od["lost_events"]:
            fail("lost records add up to more than lost_events")
    elif od.get("lost_events") != 0:
        fail("lost events: %r" % od.get("lost_events"))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    if not any(n.startswith("M") for (pid, _), n in names.items() if pid == 1):
        fail("no M lane")
    if not any(n.startswith("P") for (pid, _), n in names.items() if pid == 2):
        fail("no P lane")
    eps = 0.002  # microseconds: the JSON's rounding
    lanes = {}
    per_g = {}
    for e in evs:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "g" and e["pid"] == 1:
            lanes.setdefault(e["tid"], []).append(e)
            per_g.setdefault(e["args"]["g"], []).append(("run", e["ts"], e["ts"] + e["dur"], e["args"]["end"]))
        elif cat in ("create", "ready"):
            per_g.setdefault(e["args"]["g"], []).append((cat, e["ts"], e["ts"], ""))
    nslices = 0
    for tid, sl in lanes.items():
        sl.sort(key=lambda e: e["ts"])
        nslices += len(sl)
        for a, b in zip(sl, sl[1:]):
            if a["ts"] + a["dur"] > b["ts"] + eps:
                fail("lane %s: %s [%.3f +%.3f] overlaps %s at %.3f" %
                     (names.get((1, tid), tid), a["name"], a["ts"], a["dur"], b["name"], b["ts"]))
    if nslices == 0:
        fail("no coroutine slices")
    for g, items in ([] if want_lost else per_g.items()):
        # a run and the ready that caused it share a timestamp at most; a
        # ready recorded by the waker sorts before the run it causes
        order = {"create": 0, "ready": 1, "run": 2}
        items.sort(key=lambda t: (t[1], order[t[0]]))
        created = items[0][0] == "create"
        state = "new" if created else "unknown"  # started before the trace
        for kind, ts, end, why in items:
            if state == "exited":
                fail("G%s: %s at %.3f after its exit" % (g, kind, ts))
            if kind == "create":
                if state != "new":
                    fail("G%s: created twice" % g)
                state = "runnable"
            elif kind == "ready":
                if state not in ("parked", "unknown", "running"):
                    # running: readied by a waker while it was still switching away
                    fail("G%s: readied while %s at %.3f" % (g, state, ts))
                state = "runnable" if state != "running" else "readied-early"
            else:
                if state == "parked":
                    fail("G%s: ran at %.3f after a park with no ready" % (g, ts))
                if why.startswith("park"):
                    state = "parked"
                elif why == "exit":
                    state = "exited"
                else:
                    state = "runnable"
    print("trace_check: ok: %d events, %d coroutine slices, %d coroutines, %d lanes" %
          (len(evs), nslices, len(per_g), len(names)))


main()
