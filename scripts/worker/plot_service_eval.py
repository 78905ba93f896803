#!/usr/bin/env python3
"""Summarizes scripts/worker/run_service_eval.sh: markdown tables (stdout), PNG plots and one
JSON of every number (DIR/service_eval.json). Needs matplotlib for the plots (Debian:
python3-matplotlib; run with /usr/bin/python3); --no-plots prints the tables only.

Usage: /usr/bin/python3 scripts/worker/plot_service_eval.py [--dir .cache/eval/service]
"""
import argparse
import glob
import json
import math
import os

FORMAT_NAMES = {"f32": "f32 (reference)", "f16": "f16", "fp8": "FP8 E4M3", "int8": "INT8",
                "int4": "INT4 g32", "int4g64": "INT4 g64", "nvfp4": "NVFP4"}


def length_bucket(tokens):
    """Context tokens -> the requested length (1024, 2048, 4096, 8000...)."""
    for want in (512, 1024, 2048, 4096, 8000, 8192, 16384):
        if abs(tokens - want) <= 0.05 * want:
            return want
    return tokens


def load(d):
    scores = []
    for path in sorted(glob.glob(os.path.join(d, "passkey_*.json"))):
        data = json.load(open(path))
        hay = os.path.basename(data["haystack"]).replace(".txt", "")
        for s in data["scores"]:
            s["haystack"] = hay
            s["length"] = length_bucket(s["context_tokens"])
            scores.append(s)
    ppl = {}
    for path in sorted(glob.glob(os.path.join(d, "ppl_*.json"))):
        fmt = os.path.basename(path)[4:-5]
        ppl[fmt] = json.load(open(path))
    run = json.load(open(os.path.join(d, "run.json"))) if os.path.exists(
        os.path.join(d, "run.json")) else {}
    return scores, ppl, run


def case_key(s):
    return (s["haystack"], s["context_tokens"], s["depth"], s["key_index"])


def summarize(scores):
    policies = list(dict.fromkeys(s["policy"] for s in scores))
    full = {case_key(s): s for s in scores if s["policy"] == "full"}
    rows = []
    for p in policies:
        mine = [s for s in scores if s["policy"] == p]
        n = len(mine)
        tf = sum(s["teacher_forced_match"] for s in mine)
        gen = sum(s["generated_match"] for s in mine)
        logp = sum(s["answer_logprob"] for s in mine) / n
        deltas = [s["answer_logprob"] - full[case_key(s)]["answer_logprob"] for s in mine
                  if case_key(s) in full]
        # Answers that changed against the full cache (either way).
        flips = sum(s["generated_match"] != full[case_key(s)]["generated_match"] for s in mine
                    if case_key(s) in full)
        longest = max(s["length"] for s in mine)
        ratio_long = [s["dense_f16_bytes"] / s["kv_bytes"] for s in mine
                      if s["length"] == longest and s["kv_bytes"] > 0]
        per_len = {}
        for s in mine:
            c = per_len.setdefault(s["length"], [0, 0, 0, 0.0, 0.0])
            c[0] += 1
            c[1] += s["teacher_forced_match"]
            c[2] += s["generated_match"]
            c[3] += s["answer_logprob"]
            c[4] += s["dense_f16_bytes"] / max(s["kv_bytes"], 1)
        rows.append({
            "policy": p, "cases": n, "tf": tf, "gen": gen,
            "tf_acc": 100.0 * tf / n, "gen_acc": 100.0 * gen / n, "mean_logp": logp,
            "mean_delta_logp_vs_full": sum(deltas) / len(deltas) if deltas else None,
            "answers_changed_vs_full": flips,
            "kv_ratio_longest": sum(ratio_long) / len(ratio_long) if ratio_long else None,
            "longest": longest,
            "per_length": {str(k): {"cases": v[0], "tf": v[1], "gen": v[2],
                                    "mean_logp": v[3] / v[0], "kv_ratio": v[4] / v[0]}
                           for k, v in sorted(per_len.items())},
        })
    return rows


def print_passkey(rows):
    lengths = sorted({int(k) for r in rows for k in r["per_length"]})
    print("| policy (in kvcached) | " + " | ".join("%d tok: exact / mean log p" % l for l in lengths)
          + " | all: teacher-forced / greedy exact | mean log p (Δ vs full) | answers changed"
          " vs full | KV vs f16 (%d tok) |" % rows[0]["longest"])
    print("|---" * (len(lengths) + 5) + "|")
    for r in rows:
        cells = []
        for l in lengths:
            c = r["per_length"].get(str(l))
            cells.append("%d/%d / %.2f" % (c["gen"], c["cases"], c["mean_logp"]) if c else "-")
        d = r["mean_delta_logp_vs_full"]
        print("| %s | %s | %d/%d (%.0f%%) / %d/%d (%.0f%%) | %.2f (%s) | %d | %.1fx smaller |" % (
            r["policy"], " | ".join(cells), r["tf"], r["cases"], r["tf_acc"], r["gen"], r["cases"],
            r["gen_acc"], r["mean_logp"], "-" if d is None or r["policy"] == "full" else "%+.2f" % d,
            r["answers_changed_vs_full"], r["kv_ratio_longest"] or 0))


def print_ratios(rows):
    lengths = sorted({int(k) for r in rows for k in r["per_length"]})
    print()
    print("| policy | " + " | ".join("KV vs f16, %d tok" % l for l in lengths) + " |")
    print("|---" * (len(lengths) + 1) + "|")
    for r in rows:
        print("| %s | %s |" % (r["policy"], " | ".join(
            "%.1fx" % r["per_length"][str(l)]["kv_ratio"] if str(l) in r["per_length"] else "-"
            for l in lengths)))


def print_ppl(ppl):
    if not ppl:
        return
    ref = ppl.get("f32") or ppl.get("f16")
    ref_ppl = ref["results"][0]["perplexity"]
    print()
    print("| storage format (full cache in kvcached) | tokens | perplexity | vs f32 | seconds |")
    print("|---|---|---|---|---|")
    for fmt in FORMAT_NAMES:
        if fmt not in ppl:
            continue
        r = ppl[fmt]["results"][0]
        print("| %s | %d | %.3f | %+.2f%% | %.0f |" % (
            FORMAT_NAMES[fmt], r["tokens_scored"] + 1, r["perplexity"],
            100.0 * (r["perplexity"] / ref_ppl - 1), r["seconds"]))


def plot(scores, rows, ppl, d):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    policies = [r["policy"] for r in rows]
    lengths = sorted({s["length"] for s in scores})
    depths = sorted({s["depth"] for s in scores})
    cols = 6
    nrows = math.ceil(len(policies) / cols)
    for metric, cmap, vmin, vmax, label, fname in (
            ("answer_logprob", "RdYlGn", -20, 0, "mean log p(pass key), nats",
             "service_passkey_logp.png"),
            ("generated_match", "RdYlGn", 0, 1, "greedy exact match (fraction of cases)",
             "service_passkey_accuracy.png")):
        fig, axes = plt.subplots(nrows, cols, figsize=(2.6 * cols, 2.5 * nrows), squeeze=False)
        for i, ax in enumerate(axes.flat):
            if i >= len(policies):
                ax.axis("off")
                continue
            p = policies[i]
            grid = [[0.0] * len(lengths) for _ in depths]
            text = [[""] * len(lengths) for _ in depths]
            for di, dep in enumerate(depths):
                for li, ln in enumerate(lengths):
                    cell = [s for s in scores if s["policy"] == p and s["length"] == ln
                            and s["depth"] == dep]
                    if not cell:
                        continue
                    grid[di][li] = sum(float(s[metric]) for s in cell) / len(cell)
                    ok = sum(s["generated_match"] for s in cell)
                    text[di][li] = "%d/%d" % (ok, len(cell))
            im = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
            for di in range(len(depths)):
                for li in range(len(lengths)):
                    ax.text(li, di, text[di][li], ha="center", va="center", fontsize=6)
            ax.set_xticks(range(len(lengths)), ["%dK" % round(l / 1024) if l >= 1000 else str(l)
                                                for l in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), ["%d%%" % (100 * x) for x in depths], fontsize=7)
            ax.set_title(p, fontsize=8)
        fig.suptitle("SmolLM2-135M, KV cache in kvcached: pass key (Emma + WEB Bible); "
                     "cell text = greedy exact / cases", fontsize=9)
        fig.subplots_adjust(hspace=0.45)
        fig.colorbar(im, ax=axes.ravel().tolist(), label=label, shrink=0.6)
        fig.savefig(os.path.join(d, fname), dpi=100)
        plt.close(fig)
        print("wrote", os.path.join(d, fname))
    if ppl:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for fmt in FORMAT_NAMES:
            if fmt not in ppl:
                continue
            r = ppl[fmt]["results"][0]
            seg = r["segment"]
            xs = [(i + 1) * seg for i in range(len(r["segment_perplexity"]))]
            ax.plot(xs, r["segment_perplexity"], marker=".", linewidth=1,
                    label="%s: %.2f" % (FORMAT_NAMES[fmt], r["perplexity"]))
        ax.set_xlabel("tokens of Persuasion read")
        ax.set_ylabel("perplexity of the 512-token segment")
        ax.set_title("SmolLM2-135M, full KV cache in kvcached, per storage format")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(d, "service_perplexity.png"), dpi=110)
        plt.close(fig)
        print("wrote", os.path.join(d, "service_perplexity.png"))


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(root, ".cache", "eval", "service"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    scores, ppl, run = load(args.dir)
    rows = summarize(scores)
    print_passkey(rows)
    print_ratios(rows)
    print_ppl(ppl)
    out = {"run": run, "passkey_summary": rows, "passkey_scores": scores,
           "perplexity": {f: v["results"][0] for f, v in ppl.items()}}
    json.dump(out, open(os.path.join(args.dir, "service_eval.json"), "w"), indent=1)
    print("\nwrote", os.path.join(args.dir, "service_eval.json"))
    if not args.no_plots:
        plot(scores, rows, ppl, args.dir)


if __name__ == "__main__":
    main()
