"""Reads a RingZero --trace file (Chrome's trace event format, common/report/trace.hpp) for the
trace scripts (render_trace.py, trace_overlap.py), checked once for both.

    from trace_events import load_events
    events = load_events("run.json", "render_trace.py")   # spans ("ph": "X") and instants ("i")

Every span has a finite numeric pid, tid, ts and dur (microseconds; dur >= 0, ts + dur finite),
every instant a pid, tid and ts; name and cat are strings ("" when absent). Anything else, a
file that is missing, unreadable or not a regular file (a FIFO would block), bad JSON or UTF-8,
no "traceEvents" list, JSON nested too deeply, ends the script with a message naming the file
and the fix, never a traceback.
"""
import json
import math
import os
import stat
import sys


def load_events(path, tool):
    """The complete ("X") and instant ("i") events of the --trace file at `path`, in file order;
    exits with `tool`'s name and the reason when the file cannot be read or is not a trace."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, /dev/zero never end
            sys.exit(f"{tool}: {path} is not a regular file; give a --trace file")
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"{tool}: cannot read {path} ({e.strerror})")
    try:
        trace = json.loads(text)
        events = trace.get("traceEvents") if isinstance(trace, dict) else None
        if not isinstance(events, list):
            raise ValueError('no "traceEvents" list')
        events = [e for e in events if isinstance(e, dict) and e.get("ph") in ("X", "i")]
        for e in events:
            keys = ("pid", "tid", "ts", "dur") if e["ph"] == "X" else ("pid", "tid", "ts")
            if not all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool)
                       and math.isfinite(e[k]) for k in keys):
                raise ValueError(f"an event without a finite numeric {', '.join(keys)}: {e}")
            if e["ph"] == "X" and (e["dur"] < 0 or not math.isfinite(e["ts"] + e["dur"])):
                raise ValueError(f"a span with a negative duration, or an end beyond any number: {e}")
            e["name"], e["cat"] = str(e.get("name", "")), str(e.get("cat", ""))
    except (ValueError, OverflowError, RecursionError) as e:  # JSON and UTF-8 errors: ValueErrors
        sys.exit(f"{tool}: {path} is not a --trace file ({e}); make one with a chapter's "
                 "--trace FILE (chapters 05-08)")
    return events
