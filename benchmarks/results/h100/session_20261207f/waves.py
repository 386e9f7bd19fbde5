"""Group a `tachyon serve --log-level debug` log's request timelines into bursts (arrival gaps over 0.5 s) and print
each 16-request one: how long its arrivals took, when the last was admitted, when the core queued them, the first and
last first token (ms after the burst's first arrival), and how many distinct first-token times (prefill steps).

    python3 waves.py server13.log 8
"""
import re
import sys

PATTERN = (r"arrived ([\d.]+), admitted \+([\d.]+) ms, queued \+([\d.]+) ms, scheduled \+([\d.]+) ms, "
           r"first token \+([\d.]+)")
events = []
for line in open(sys.argv[1]):
    m = re.search(PATTERN, line) if "request cmpl" in line else None
    if m:
        a = float(m.group(1))
        events.append((a,) + tuple(a + float(m.group(i)) / 1e3 for i in range(2, 6)))
events.sort()
bursts = [[events[0]]]
for e in events[1:]:
    if e[0] - bursts[-1][-1][0] > 0.5:
        bursts.append([e])
    else:
        bursts[-1].append(e)
for b in bursts[:int(sys.argv[2])]:
    if len(b) != 16:
        continue
    t0 = min(e[0] for e in b)
    firsts = sorted(round((e[4] - t0) * 1e3) for e in b)
    queued = sorted(round((e[2] - t0) * 1e3, 1) for e in b)
    print(f"arrivals over {(max(e[0] for e in b) - t0) * 1e3:.1f} ms", f"admitted<={(max(e[1] for e in b) - t0) * 1e3:.1f}",
          "queued", queued[0], queued[-1], "first tokens", firsts[0], firsts[-1],
          " steps(by first-token groups):", len({round(f / 5) for f in firsts}))
