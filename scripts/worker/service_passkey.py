#!/usr/bin/env python3
"""Pass-key retrieval with the KV cache in kvcached, per compression policy.

Starts nothing: give it a running kvcached (--target) and a built kvc-worker. For each
context length x depth it plants "The pass key is N." in Persuasion, asks for it with
`kvc-worker generate --kv=kvcached`, and records whether the answer contains N and how many
bytes the service held against a full f16 cache. Prints a markdown table and writes JSON.

  python3 scripts/worker/service_passkey.py --worker build/worker/kvc-worker \
      --target 127.0.0.1:50051 --json .cache/eval/service_passkey.json
"""
import argparse
import json
import random
import re
import subprocess
import sys
import time

POLICIES = [
    ("full f16", []),
    ("int8", ["--storage", "int8"]),
    ("int4", ["--storage", "int4"]),
    ("streaming 4+252", ["--policy", "streaming=4+252"]),
    ("h2o 128+128", ["--policy", "h2o=128+128"]),
    ("snapkv 256", ["--policy", "snapkv=256"]),
    ("snapkv 256 + int4", ["--policy", "snapkv=256", "--storage", "int4"]),
    # Query-agnostic: the document is compressed before the question is prefilled.
    ("expattn 256 + int4", ["--policy", "expattn=256", "--storage", "int4"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--text", default=".cache/corpus/persuasion.txt")
    ap.add_argument("--lengths", default="4000,8000,16000", help="characters of text (~4.1 per token)")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    text = open(args.text, encoding="utf-8").read()[3000:]
    rng = random.Random(7)
    rows = []
    lengths = [int(x) for x in args.lengths.split(",")]
    depths = [float(x) for x in args.depths.split(",")]
    for length in lengths:
        for depth in depths:
            key = rng.randint(10000, 99999)
            body = text[:length]
            cut = body.find("\n\n", int(len(body) * depth))
            cut = cut if cut >= 0 else int(len(body) * depth)
            doc = body[:cut] + f"\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n" + body[cut:]
            path = "/tmp/kvc_passkey_doc.txt"
            open(path, "w", encoding="utf-8").write(doc)
            for name, flags in POLICIES:
                t0 = time.time()
                out = subprocess.run(
                    [args.worker, "generate", "--kv=kvcached", f"--target={args.target}",
                     f"--prompt-file={path}", "--question=What is the pass key? Answer with the number only.",
                     "--max-new-tokens=12"] + flags,
                    capture_output=True, text=True)
                if out.returncode != 0:
                    print(out.stderr, file=sys.stderr)
                    sys.exit(1)
                m = re.search(r"prompt (\d+) tokens", out.stderr)
                held = re.search(r"holds ([\d.]+) MB .* a full f16 cache is ([\d.]+) MB: ([\d.]+)x", out.stderr)
                row = {"policy": name, "chars": length, "depth": depth, "key": key,
                       "prompt_tokens": int(m.group(1)) if m else 0,
                       "correct": str(key) in out.stdout, "answer": out.stdout.strip()[:60],
                       "held_mb": float(held.group(1)), "full_f16_mb": float(held.group(2)),
                       "ratio": float(held.group(3)), "seconds": round(time.time() - t0, 1)}
                rows.append(row)
                print(f"[passkey] {name:18s} {row['prompt_tokens']:5d} tok depth {depth:.1f} "
                      f"{'OK ' if row['correct'] else 'MISS'} {row['ratio']:5.1f}x  {row['answer']!r}",
                      file=sys.stderr, flush=True)
    print("| policy | " + " | ".join(f"~{rows[[r['chars'] for r in rows].index(l)]['prompt_tokens']} tokens" for l in lengths)
          + " | KV held vs f16 (longest) |")
    print("|---|" + "---|" * len(lengths) + "---|")
    for name, _ in POLICIES:
        cells = []
        for length in lengths:
            sel = [r for r in rows if r["policy"] == name and r["chars"] == length]
            cells.append(f"{sum(r['correct'] for r in sel)}/{len(sel)}")
        longest = [r for r in rows if r["policy"] == name and r["chars"] == lengths[-1]]
        ratio = sum(r["ratio"] for r in longest) / len(longest)
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio:.1f}x smaller |")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
