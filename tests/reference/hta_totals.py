"""Reads rtrain's step traces with Holistic Trace Analysis (the tool PyTorch users run on their
profiler's traces) and prints, per rank, the total duration in microseconds and the count of
every span name, as JSON: {"ranks": [0, 1], "totals": {"0": {"forward": [us, count], ...}}}.

    python hta_totals.py TRACE_DIR

HTA rounds float timestamps to whole microseconds unless HTA_DISABLE_NS_ROUNDING is set (each
span would lose up to 1 us), and drops the last ProfilerStep unless asked to keep it.
"""
import json
import os
import sys

os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
from hta.common.trace import Trace  # noqa: E402

trace = Trace(trace_dir=sys.argv[1])
trace.load_traces(include_last_profiler_step=True, use_multiprocessing=False)
trace.decode_symbol_ids(use_shorten_name=False)
totals = {}
for rank in trace.get_ranks():
    frame = trace.get_trace(rank)
    grouped = frame.groupby("s_name")["dur"].agg(["sum", "count"])
    totals[str(rank)] = {name: [float(row["sum"]), int(row["count"])] for name, row in grouped.iterrows()}
print(json.dumps({"ranks": sorted(int(r) for r in trace.get_ranks()), "totals": totals}))
