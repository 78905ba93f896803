#!/usr/bin/env python3
"""Summarizes pass-key runs (kvc-worker passkey --json) for issue 19's allocation grid.

Reads every passkey_*.json under the given directories and prints markdown:
  1. per policy and length: cases, accuracy (key within the generated tokens) with a 95 %
     Wilson interval, mean answer log-probability, KV held vs f16, and the share of the
     pass key's digit tokens the cache still held (when run with --key-tokens);
  2. paired differences on the same cases (e.g. adasnapkv=256:int4 - snapkv=256:int4,
     adaexpattn=256:int4 - expattn=256:int4, and query-agnostic expattn=256:int4 -
     snapkv=256:int4 at the same budget):
     accuracy points and log p, each with a 95 % interval (normal approximation of the paired
     differences), so "adaptive beats uniform" can be read with its uncertainty.
With --json OUT writes the same numbers; with --plot OUT.png (needs matplotlib) accuracy vs
KV ratio per length.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
from collections import defaultdict

BUCKETS = (512, 1024, 2048, 4096, 8000)


def bucket(tokens):
    return min(BUCKETS, key=lambda b: abs(math.log(tokens / b)))


def wilson(k, n, z=1.96):
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def mean_ci(xs, z=1.96):
    if not xs:
        return (0.0, 0.0)
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return (m, float("nan"))
    return (m, z * statistics.stdev(xs) / math.sqrt(len(xs)))


def load(dirs):
    rows = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "passkey_*.json"))):
            doc = json.load(open(path))
            for s in doc["scores"]:
                s = dict(s)
                s["label"] = doc.get("label", os.path.basename(path))
                s["bucket"] = bucket(s["context_tokens"])
                rows.append(s)
    return rows


def pairs_of(policies):
    """(uniform, other) for every adaptive/pyramid policy whose uniform twin ran, and
    (snapkv, expattn) at the same budget and storage (query-aware vs query-agnostic)."""
    out = []
    for p in policies:
        m = re.match(r"(ada)?(pyramidkv|snapkv|expattn)=(.*)", p)
        if m and (m.group(1) or m.group(2) == "pyramidkv"):
            base = ("expattn=" if m.group(2) == "expattn" else "snapkv=") + m.group(3)
            if base in policies:
                out.append((base, p))
        if m and not m.group(1) and m.group(2) == "expattn":
            base = "snapkv=" + m.group(3)
            if base in policies:
                out.append((base, p))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--pair", action="append", default=[],
                    help="BASE,OTHER: also compare these two policies on their common cases")
    args = ap.parse_args()
    rows = load(args.dirs)
    if not rows:
        sys.exit("no passkey_*.json found")
    groups = defaultdict(list)
    for s in rows:
        groups[(s["policy"], s["bucket"])].append(s)
    policies = list(dict.fromkeys(s["policy"] for s in rows))
    summary = []
    print("| policy | length | cases | accuracy (95 % CI) | mean log p | KV vs f16 | key tokens held |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for p in policies:
        for b in BUCKETS:
            g = groups.get((p, b))
            if not g:
                continue
            n = len(g)
            k = sum(1 for s in g if s["generated_match"])
            lo, hi = wilson(k, n)
            lp = statistics.fmean(s["answer_logprob"] for s in g)
            ratio = statistics.fmean(s["dense_f16_bytes"] / max(1, s["kv_bytes"]) for s in g)
            held = [s["key_slots_kept"] / s["key_slots"] for s in g if s.get("key_slots")]
            key = f"{100 * statistics.fmean(held):.0f} %" if held else "-"
            print(f"| {p} | {b} | {n} | {k}/{n} = {100 * k / n:.0f} % ({100 * lo:.0f}-{100 * hi:.0f}) "
                  f"| {lp:.2f} | {ratio:.1f}x | {key} |")
            summary.append({"policy": p, "length": b, "cases": n, "correct": k,
                            "accuracy": k / n, "ci95": [lo, hi], "mean_logprob": lp,
                            "kv_ratio_vs_f16": ratio,
                            "key_tokens_held": statistics.fmean(held) if held else None})
    diffs = []
    pairs = list(dict.fromkeys(pairs_of(policies) + [tuple(p.split(",", 1)) for p in args.pair]))
    if pairs:
        print()
        print("| comparison (same cases) | length | cases | accuracy difference, points (95 % CI) "
              "| log p difference (95 % CI) |")
        print("| --- | --- | --- | --- | --- |")
    for base, other in pairs:
        for b in BUCKETS:
            case = lambda s: (s["label"], s["context_tokens"], s["depth"], s["passkey"])
            a = {case(s): s for s in groups.get((base, b), [])}
            o = {case(s): s for s in groups.get((other, b), [])}
            common = sorted(set(a) & set(o))
            if not common:
                continue
            dacc = [int(o[c]["generated_match"]) - int(a[c]["generated_match"]) for c in common]
            dlp = [o[c]["answer_logprob"] - a[c]["answer_logprob"] for c in common]
            ma, ha = mean_ci(dacc)
            ml, hl = mean_ci(dlp)
            print(f"| {other} - {base} | {b} | {len(common)} | {100 * ma:+.1f} (±{100 * ha:.1f}) "
                  f"| {ml:+.2f} (±{hl:.2f}) |")
            diffs.append({"uniform": base, "other": other, "length": b, "cases": len(common),
                          "accuracy_diff": ma, "accuracy_diff_ci95": ha,
                          "logprob_diff": ml, "logprob_diff_ci95": hl})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"policies": summary, "paired": diffs}, f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        lengths = sorted({r["length"] for r in summary})
        fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4), squeeze=False)
        for ax, b in zip(axes[0], lengths):
            for r in (r for r in summary if r["length"] == b):
                lo, hi = r["ci95"]
                ax.errorbar(r["kv_ratio_vs_f16"], 100 * r["accuracy"],
                            yerr=[[100 * (r["accuracy"] - lo)], [100 * (hi - r["accuracy"])]],
                            fmt="o", capsize=3, label=r["policy"])
            ax.set_xscale("log")
            ax.set_xlabel("KV held, x smaller than f16")
            ax.set_ylabel("pass key found (%)")
            ax.set_title(f"{b} tokens")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
