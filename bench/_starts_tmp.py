import json, sys, glob, statistics as st
rows = {}
for p in sorted(glob.glob(sys.argv[1] + "/*/report.json")):
    r = json.load(open(p))
    for sess, f in (r.get("facts") or {}).items():
        for k, v in f.items():
            if k.endswith("_s"):
                try: rows.setdefault(k, []).append(float(v))
                except (TypeError, ValueError): pass
print(f"{'phase':14} {'n':>3} {'mean':>6} {'max':>6} {'sum':>7}")
for k, v in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
    print(f"{k:14} {len(v):3} {st.mean(v):6.2f} {max(v):6.2f} {sum(v):7.1f}")
