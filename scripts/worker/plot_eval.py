#!/usr/bin/env python3
"""Plots the worker evaluation JSON (kvc-worker perplexity/passkey --json) into PNGs and prints
markdown tables. Needs matplotlib (Debian: apt-get install python3-matplotlib; run with
/usr/bin/python3). Only the evaluation needs it; builds and tests do not.

Usage: /usr/bin/python3 scripts/worker/plot_eval.py [--dir .cache/eval]
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_perplexity(files, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rows = []
    for path in files:
        data = json.load(open(path))
        for r in data["results"]:
            seg = r["segment"]
            xs = [(i + 1) * seg for i in range(len(r["segment_perplexity"]))]
            label = "%s (%d tok)" % (r["policy"], r["tokens_scored"] + 1)
            ax.plot(xs, r["segment_perplexity"], marker=".", label=label)
            rows.append((r["policy"], r["tokens_scored"] + 1, r["perplexity"], r["peak_kv_slots"],
                         r["seconds"]))
    ax.axvline(8192, color="grey", linestyle=":", linewidth=1)
    ax.text(8192, ax.get_ylim()[1], " 8K context", va="top", fontsize=8, color="grey")
    ax.set_xlabel("tokens of Persuasion read")
    ax.set_ylabel("perplexity of the segment")
    ax.set_yscale("log")
    ax.set_title("SmolLM2-135M, local KV cache: perplexity per segment")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("| policy | tokens | perplexity | peak KV slots | seconds |")
    print("| --- | --- | --- | --- | --- |")
    for p, n, ppl, slots, s in rows:
        print("| %s | %d | %.3f | %d | %.0f |" % (p, n, ppl, slots, s))
    print("\nwrote", out)


def plot_passkey(path, out):
    data = json.load(open(path))["scores"]
    policies = list(dict.fromkeys(s["policy"] for s in data))
    fig, axes = plt.subplots(1, len(policies), figsize=(3.2 * len(policies), 3.2), squeeze=False)
    for ax, policy in zip(axes[0], policies):
        mine = [s for s in data if s["policy"] == policy]
        lengths = sorted({s["context_tokens"] // 128 * 128 for s in mine})
        depths = sorted({s["depth"] for s in mine})
        grid = [[0.0] * len(lengths) for _ in depths]
        for s in mine:
            li = lengths.index(s["context_tokens"] // 128 * 128)
            di = depths.index(s["depth"])
            grid[di][li] = s["answer_logprob"]
        im = ax.imshow(grid, cmap="RdYlGn", vmin=-15, vmax=0, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(x) for x in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), ["%d%%" % (100 * d) for d in depths], fontsize=7)
        ax.set_title(policy, fontsize=9)
        ax.set_xlabel("context tokens", fontsize=8)
    axes[0][0].set_ylabel("needle depth", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), label="log p(pass key)", shrink=0.8)
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(root, ".cache", "eval"))
    args = ap.parse_args()
    ppl = sorted(os.path.join(args.dir, f) for f in os.listdir(args.dir)
                 if f.startswith("ppl_") and f.endswith(".json"))
    if ppl:
        plot_perplexity(ppl, os.path.join(args.dir, "perplexity.png"))
    pk = os.path.join(args.dir, "passkey.json")
    if os.path.exists(pk):
        plot_passkey(pk, os.path.join(args.dir, "passkey_heatmap.png"))


if __name__ == "__main__":
    main()
