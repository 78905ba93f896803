#!/usr/bin/env python3
"""Plots of the kvpress / kvcached side by side (docs/EVALUATION.md, issue 17).

Three panels from the JSON lines of kvpress_side_by_side.py (one file per length) and
kvpress_perplexity.py: pass keys found per setting and length (question inside the compressed
prompt), found by depth of the key, and perplexity after compression against KV bytes.
Needs matplotlib (pip install matplotlib).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import Any, Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The settings shown, in order, with short labels; the rest of the files is left out.
PASSKEY = [("hf-full", "transformers full"), ("kvcached-full", "kvcached full"),
           ("kvpress-snapkv", "kvpress SnapKV (defaults)"),
           ("kvpress-snapkv-w32k13", "kvpress SnapKV w32 k13"),
           ("kvcached-snapkv-avg-w32k13", "kvcached SnapKV w32 avg13"),
           ("kvcached-snapkv", "kvcached SnapKV w32 max13"),
           ("kvcached-snapkv-int4", "kvcached SnapKV + INT4"),
           ("kvpress-streaming", "kvpress StreamingLLM"),
           ("kvcached-streaming-int4", "kvcached StreamingLLM + INT4"),
           ("kvpress-expattn", "kvpress ExpectedAttention"),
           ("kvcached-expattn-int4", "kvcached ExpectedAttention + INT4")]
BY_DEPTH = ["hf-full", "kvcached-snapkv-int4", "kvpress-snapkv", "kvpress-streaming"]


def load(path: str) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passkey", required=True, help="comma-separated side-by-side JSON lines")
    ap.add_argument("--perplexity", required=True, help="kvpress_perplexity.py JSON lines")
    ap.add_argument("--out", required=True, help="PNG")
    args = ap.parse_args()
    runs = {}
    for path in args.passkey.split(","):
        rows = [r for r in load(path) if r["placement"] == "inside"]
        runs[f"{rows[0]['length'] // 1024}K"] = rows
    fig, axes = plt.subplots(1, 3, figsize=(21, 6.5), gridspec_kw={"width_ratios": [1.4, 1, 1]})

    ax = axes[0]
    labels = [label for _, label in PASSKEY]
    width = 0.8 / len(runs)
    for i, (length, rows) in enumerate(runs.items()):
        found = []
        for setting, _ in PASSKEY:
            rs = [r for r in rows if r["setting"] == setting]
            found.append(sum(r["found"] for r in rs) / len(rs) if rs else math.nan)
        n = len({r["case"] for r in rows})
        ax.barh([y + i * width for y in range(len(labels))], found, height=width,
                label=f"{length} ({n} cases)")
    ax.set_yticks([y + width * (len(runs) - 1) / 2 for y in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.set_xlabel("pass keys found (question inside; 1/4 of the prompt kept)")
    ax.set_xlim(0, 1)
    ax.legend(loc="lower right")

    ax = axes[1]
    for setting in BY_DEPTH:
        rows = [r for rs in runs.values() for r in rs if r["setting"] == setting]
        depths = sorted({r["depth"] for r in rows})
        full = setting == "hf-full"  # drawn wide: SnapKV's line often lies on it
        ax.plot(depths, [sum(r["found"] for r in rows if r["depth"] == d) /
                         sum(1 for r in rows if r["depth"] == d) for d in depths], marker="o",
                label=dict(PASSKEY)[setting], linewidth=6 if full else 1.5,
                alpha=0.4 if full else 1.0)
    ax.set_xlabel("depth of the pass key in the context")
    ax.set_ylabel(f"found (all lengths: {', '.join(runs)})")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()

    ax = axes[2]
    rows = load(args.perplexity)
    full = {(r["text"], r["window"]): r["nll"] for r in rows if r["setting"] == "hf-full"}
    by: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    colors = plt.get_cmap("tab20").colors
    for i, (setting, rs) in enumerate(by.items()):
        paired = [r["nll"] - full[(r["text"], r["window"])] for r in rs
                  if (r["text"], r["window"]) in full]
        ratio = sum(r["f16_bytes"] / r["bytes"] for r in rs) / len(rs)
        ppl = math.exp(sum(paired) / len(paired))
        kvpress = setting.startswith(("kvpress", "hf"))
        ax.scatter(ratio, ppl, marker="s" if kvpress else "o", color=colors[i % len(colors)],
                   s=50, label=setting, alpha=0.8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_xscale("log")
    ax.set_xlabel("KV bytes, f16 full cache / held\n(kvpress and transformers: squares, kvcached: circles)")
    ax.set_ylabel("perplexity of the next 256 tokens / full cache's")
    fig.suptitle("SmolLM2-135M-Instruct in transformers: kvpress (DynamicCache) and kvcached "
                 "(kvcache.hf) on the same token ids")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
