#!/usr/bin/env python3
"""test_trace's names case: TRACE.json holds both coroutine names as test_trace
gave them (UTF-8 kept, escapes decoded, a cut sequence as U+FFFD), and the
viewer's page for it, PAGE.html, has no '<' inside its data that could end
or comment out the script. Exit 0 if so."""
import json
import sys

ODD = "\u00e9<!--<script\"\\\x01"  # test_trace.c's odd_name
CUT = "cut\ufffd"                              # bad_utf8: "cut\xc3"


def strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from strings(x)


with open(sys.argv[1], encoding="utf-8") as f:
    found = list(strings(json.load(f)))
ok = True
for want in (ODD, CUT):
    if not any(want in s for s in found):
        print("trace_names_check: %r not in the trace" % want)
        ok = False
with open(sys.argv[2], encoding="utf-8") as f:
    page = f.read()
if "<!--" in page or page.count("<script>") != page.count("</script>"):
    print("trace_names_check: the page's script is broken by a name")
    ok = False
sys.exit(0 if ok else 1)
