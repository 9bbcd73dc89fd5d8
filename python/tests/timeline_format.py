"""The Chrome trace event format's required fields, from its documentation (the JSON object form:
"traceEvents" an array, "displayTimeUnit" 'ms' or 'ns' when given; every event a string name, a
one-letter phase ph, a timestamp ts in microseconds, integer pid and tid; a complete event X a
duration dur; an instant event i a scope s of g, p or t; process_name and thread_name metadata a
string args.name). Shared by the timeline tests of cpkv replay and the conformance harness."""

from __future__ import annotations

import json


def checked_events(path) -> list:
    with open(path) as f:
        doc = json.load(f)
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and isinstance(e["ph"], str) and len(e["ph"]) == 1, e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t"), e
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name"):
            assert isinstance(e["args"]["name"], str), e
    return doc["traceEvents"]
