"""Engine-side inter-token gaps from a `minisgl serve --trace-out` file: per request, the gaps between the ends of
the steps that gave it a token; and the step times by phase. Compare with the client's ITL."""
import json, sys, statistics as st
events = [json.loads(l) for l in open(sys.argv[1]) if '"type": "step"' in l]
def pct(xs, q):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
by_phase = {}
for e in events:
    by_phase.setdefault(e["phase"], []).append(e["elapsed_s"])
for ph, xs in by_phase.items():
    print(f"{ph}: {len(xs)} steps, elapsed ms p50 {1e3*pct(xs,.5):.1f} p99 {1e3*pct(xs,.99):.1f} max {1e3*max(xs):.1f}")
last, gaps, behind = {}, [], []
for e in events:
    end = e["started_s"] + e["elapsed_s"]
    for r in e["reqs"]:
        uid = r["uid"]
        if uid in last:
            gaps.append(end - last[uid][0])
            behind.append((end - last[uid][0], last[uid][1]))
        last[uid] = (end, e["step"])
    for uid in e["finished"]:
        last.pop(uid, None)
print(f"engine-side gaps: {len(gaps)}, p50 {1e3*pct(gaps,.5):.1f} p99 {1e3*pct(gaps,.99):.1f} ms")
steps = {e["step"]: e for e in events}
big = sorted(behind, reverse=True)[: max(1, len(behind) // 100)]
kinds = {}
for gap, step in big:
    # what ran between this request's two tokens
    nxt = [steps[s]["phase"] for s in range(step + 1, step + 12) if s in steps]
    kinds[tuple(nxt[:3])] = kinds.get(tuple(nxt[:3]), 0) + 1
print("the 1% longest gaps: steps after the request's previous token:", sorted(kinds.items(), key=lambda kv: -kv[1])[:5])
pre = [(e["num_tokens"], e["elapsed_s"], e["batch_size"]) for e in events if e["phase"] == "prefill"]
for lo, hi in ((0, 600), (600, 1200), (1200, 2500), (2500, 5000), (5000, 9000)):
    xs = [t for n, t, b in pre if lo <= n < hi]
    if xs:
        print(f"prefill {lo}-{hi} tokens: {len(xs)} steps, ms p50 {1e3*pct(xs,.5):.2f} p90 {1e3*pct(xs,.9):.2f}")
dec = [(e["batch_size"], e["elapsed_s"]) for e in events if e["phase"] == "decode"]
for lo, hi in ((1, 64), (64, 128), (128, 257)):
    xs = [t for b, t in dec if lo <= b < hi]
    if xs:
        print(f"decode {lo}-{hi} rows: {len(xs)} steps, ms p50 {1e3*pct(xs,.5):.2f} p90 {1e3*pct(xs,.9):.2f}")
# how many prefill steps in a row before each decode step
runs, run = [], 0
for e in events:
    if e["phase"] == "prefill":
        run += 1
    else:
        if run: runs.append(run)
        run = 0
print("prefill runs between decode steps:", {k: runs.count(k) for k in sorted(set(runs))})
