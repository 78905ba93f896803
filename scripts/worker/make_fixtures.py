#!/usr/bin/env python3
"""Regenerates tests/worker/fixtures/ from independent implementations of SmolLM2-135M (GGUF).

Oracles (none of them is our C++ code):
  * tokenization: Hugging Face `tokenizers` (Rust BPE) configured like SmolLM2's tokenizer.json
    from the GGUF vocabulary and merges, cross-checked against llama.cpp's tokenizer
    (`llama-cpp-python`); both must agree on every case.
  * logits: llama.cpp (via `llama-cpp-python`, built from source) evaluating the same GGUF, and
    a small NumPy forward pass on weights dequantized by the `gguf` package (the f32 math our
    engine does, so it allows a tight tolerance).

Set-up (no torch needed; building llama-cpp-python takes ~15 min on 2 cores):
  /usr/bin/python3 -m venv .cache/venv-fixtures
  .cache/venv-fixtures/bin/pip install gguf==0.19.0 numpy==2.4.6 tokenizers==0.23.3 \
      llama-cpp-python==0.3.36
  scripts/fetch_model.sh && python3 scripts/worker/extract_corpus.py
  .cache/venv-fixtures/bin/python scripts/worker/make_fixtures.py

Outputs (small, committed):
  corpus_token_hashes.txt  per novel: token count and FNV-1a 64 of the ids (both oracles agree)
  tokenizer_cases.txt   per case: "TEXT <hex utf-8>", "SPECIAL 0|1", "IDS id id ..."
  logits_cases.txt      per prompt: "PROMPT <name>", "IDS ...", then per position
                        "POS i top1_llama top1_numpy" and the top-8 ids with both logits
  logits_last_<name>.f16  llama.cpp last-position logits [vocab] (little-endian f16)
  logits_last_<name>.np.f16  NumPy last-position logits [vocab]
"""
import argparse
import os
import random
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, ".cache", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
CORPUS = os.path.join(ROOT, ".cache", "corpus")
OUT = os.path.join(ROOT, "tests", "worker", "fixtures")

TRICKY = [
    "Hello world", " Hello  world ", "I'm sure you've heard they'll go; it's 'quoted'.",
    "Numbers: 12345, 3.14159, 2024-11-29 and 1,000,000!", "tabs\tand\nnewlines\n\n\nend",
    "   leading spaces and trailing   ", "ÀÉÎÕÜ café naïve coöperate — “smart quotes” …",
    "日本語のテキストと中文字符", "emoji 🙂👍🏽 and symbols ©®™ ∑∫√", "CamelCaseWords and snake_case_words",
    "x+=1; if (a<b) {return a->b;}", "<|im_start|>user\nHi there<|im_end|>\n",
    "Don'T SHOUT'S 'S 'll", "e.g. U.S.A. Mr. Elliot's", "a\r\nb\u00a0c\u2009d", "١٢٣ Ⅻ ½ ²",
]

# The six novels from extract_corpus.py (the Bible there is a haystack, not a fixture source).
AUSTEN = ["emma.txt", "mansfieldpark.txt", "northangerabbey.txt", "persuasion.txt",
          "prideprejudice.txt", "sensesensibility.txt"]

PROMPTS = {
    "chat_france": ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
                    "<|im_end|>\n<|im_start|>assistant\n", True),
    "fox": ("The quick brown fox jumps over the lazy dog. The quick brown fox", False),
}


def gguf_tokenizer(reader):
    """HF tokenizers object equivalent to SmolLM2's tokenizer.json, built from GGUF metadata."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

    f = reader.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
             for i in f["tokenizer.ggml.token_type"].data]
    merges = [tuple(bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8").split(" ", 1))
              for i in f["tokenizer.ggml.merges"].data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


def corpus_samples(rng, n_samples):
    texts = []
    for name in AUSTEN:
        with open(os.path.join(CORPUS, name), encoding="utf-8") as fh:
            text = fh.read()
        for _ in range(n_samples):
            start = rng.randrange(0, len(text) - 2000)
            texts.append(text[start:start + rng.randrange(300, 1500)])
    return texts


def numpy_forward(reader, ids):
    """Plain f32 Llama forward pass (HF layout: un-permuted Q/K, rotate-half RoPE)."""
    from gguf.quants import dequantize

    t = {x.name: x for x in reader.tensors}

    def w(name):
        x = t[name]
        return dequantize(x.data, x.tensor_type).reshape([int(d) for d in reversed(x.shape)])

    def unpermute(m, heads):
        hd = m.shape[0] // heads
        return m.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(m.shape)

    f = reader.fields
    nl = int(f["llama.block_count"].contents())
    nh = int(f["llama.attention.head_count"].contents())
    nkv = int(f["llama.attention.head_count_kv"].contents())
    theta = float(f["llama.rope.freq_base"].contents())
    eps = float(f["llama.attention.layer_norm_rms_epsilon"].contents())
    emb = w("token_embd.weight").astype(np.float32)
    d = emb.shape[1]
    hd = d // nh
    n = len(ids)
    inv = (1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))).astype(np.float64)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def rope(x):  # x [n, heads, hd]
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    def rms(x, g):
        return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(
            np.float32) * g

    x = emb[ids]
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    for l in range(nl):
        p = "blk.%d." % l
        h = rms(x, w(p + "attn_norm.weight"))
        q = (h @ unpermute(w(p + "attn_q.weight"), nh).T).reshape(n, nh, hd)
        k = (h @ unpermute(w(p + "attn_k.weight"), nkv).T).reshape(n, nkv, hd)
        v = (h @ w(p + "attn_v.weight").T).reshape(n, nkv, hd)
        q, k = rope(q), rope(k)
        out = np.zeros((n, nh, hd), dtype=np.float32)
        for qh in range(nh):
            kh = qh // (nh // nkv)
            s = q[:, qh] @ k[:, kh].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, qh] = (s / s.sum(-1, keepdims=True)) @ v[:, kh]
        x = x + out.reshape(n, -1) @ w(p + "attn_output.weight").T
        h = rms(x, w(p + "ffn_norm.weight"))
        g = h @ w(p + "ffn_gate.weight").T
        u = h @ w(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ w(p + "ffn_down.weight").T
    return rms(x, w("output_norm.weight")) @ emb.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples-per-novel", type=int, default=6)
    args = ap.parse_args()
    import gguf
    import llama_cpp

    # llama.cpp's AMX weight repacking (chosen on CPUs that report AMX) segfaults in containers
    # that do not grant AMX tile state; plain CPU buffers avoid it and change no numerics.
    default_params = llama_cpp.llama_model_default_params

    def params_without_extra_buffers():
        p = default_params()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama.llama_cpp.llama_model_default_params = params_without_extra_buffers

    reader = gguf.GGUFReader(MODEL)
    hf = gguf_tokenizer(reader)
    llm = llama_cpp.Llama(model_path=MODEL, n_ctx=1024, n_batch=512, logits_all=True,
                          n_threads=2, verbose=False)
    os.makedirs(OUT, exist_ok=True)

    rng = random.Random(20261129)
    cases = [(t, False) for t in TRICKY] + [(TRICKY[11], True)]
    cases += [(t, False) for t in corpus_samples(rng, args.samples_per_novel)]
    mismatches = 0
    with open(os.path.join(OUT, "tokenizer_cases.txt"), "w") as fh:
        fh.write("# made by scripts/worker/make_fixtures.py; oracle: HF tokenizers == llama.cpp\n")
        for text, special in cases:
            if special:
                ids = hf.encode(text, add_special_tokens=True).ids
            else:
                # HF always matches added tokens; run its pre-tokenizer and BPE model directly.
                ids = plain_ids(hf, text)
            ref = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            if list(ids) != list(ref):
                mismatches += 1
                print("tokenizer oracles disagree on %r:\n hf %s\n llama %s" % (
                    text[:60], ids[:20], ref[:20]), file=sys.stderr)
                continue
            fh.write("TEXT %s\nSPECIAL %d\nIDS %s\n" % (text.encode("utf-8").hex(), int(special),
                                                       " ".join(map(str, ids))))
    print("tokenizer cases: %d, oracle disagreements (dropped): %d" % (len(cases), mismatches))

    # Whole novels (~1M tokens): only a count and a hash go in the fixture; the test re-reads
    # the corpus from .cache/corpus when it is there.
    with open(os.path.join(OUT, "corpus_token_hashes.txt"), "w") as fh:
        fh.write("# made by scripts/worker/make_fixtures.py: NOVEL file tokens fnv1a64(ids as u32 LE)\n")
        for name in AUSTEN:
            text = open(os.path.join(CORPUS, name), encoding="utf-8").read()
            ids = plain_ids(hf, text)
            ref = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            if list(ids) != list(ref):
                raise SystemExit("tokenizer oracles disagree on %s" % name)
            fh.write("NOVEL %s %d %016x\n" % (name, len(ids), fnv1a64(ids)))
            print("%s: %d tokens, oracles agree" % (name, len(ids)))

    persuasion = open(os.path.join(CORPUS, "persuasion.txt"), encoding="utf-8").read()
    prompts = dict(PROMPTS)
    prompts["persuasion"] = (persuasion[2000:3200], False)
    with open(os.path.join(OUT, "logits_cases.txt"), "w") as fh:
        fh.write("# made by scripts/worker/make_fixtures.py; logits of llama.cpp and NumPy f32\n")
        for name, (text, special) in prompts.items():
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            llm.reset()
            llm.eval(ids)
            ref = np.array(llm.scores[:len(ids)], dtype=np.float32)
            npl = numpy_forward(reader, ids).astype(np.float32)
            agree = float((ref.argmax(-1) == npl.argmax(-1)).mean())
            print("%s: %d tokens, llama.cpp vs numpy: max|diff| %.4f, top-1 agreement %.3f" % (
                name, len(ids), float(np.abs(ref - npl).max()), agree))
            fh.write("PROMPT %s\nIDS %s\n" % (name, " ".join(map(str, ids))))
            for i in range(len(ids)):
                top = np.argsort(-ref[i])[:8]
                fh.write("POS %d %d %d %s\n" % (i, int(ref[i].argmax()), int(npl[i].argmax()), " ".join(
                    "%d:%.4f:%.4f" % (t, ref[i, t], npl[i, t]) for t in top)))
            ref[-1].astype("<f2").tofile(os.path.join(OUT, "logits_last_%s.f16" % name))
            npl[-1].astype("<f2").tofile(os.path.join(OUT, "logits_last_%s.np.f16" % name))


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for b in np.asarray(ids, dtype="<u4").tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def plain_ids(hf, text):
    """Token ids of `text` with special-token strings treated as plain text."""
    pieces = hf.pre_tokenizer.pre_tokenize_str(text)
    ids = []
    for piece, _ in pieces:
        ids += [t.id for t in hf.model.tokenize(piece)]
    return ids


if __name__ == "__main__":
    main()
