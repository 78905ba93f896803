"""kvcache.hf.KvcachedCache: SmolLM2-135M-Instruct in transformers (CPU) generating with its KV
cache in a real kvcached. The model is the project's GGUF (scripts/fetch_model.sh); prompts are
tokenized by kvc-worker so that both engines see the same ids. A missing model, worker or
torch/transformers fails these tests (CI installs and fetches all of them)."""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import re
import subprocess
from typing import Iterator, List, Tuple

import pytest

import kvcache
from conftest import REPO, Server, start

import torch
import transformers

import kvcache.hf

MODEL_DIR = REPO / ".cache" / "models"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = "num_layers: 30 num_kv_heads: 3 num_query_heads: 9 head_dim: 64"
HF_POOLS = "".join(
    f'pools {{ name: "{name}" capacity_bytes: 67108864 geometry {{ {SMOLLM2} dtype: {dtype} '
    'rope { theta: 100000 } } }\n'
    for name, dtype in [("smollm2-f32", "DTYPE_F32"), ("smollm2-f16", "DTYPE_F16")])
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
          "again. ")
# transformers 5.24 renamed generate's and forward's past_key_values to cache (the old name
# warns until 6.0); kvpress pins transformers < 5.3, where only the old name exists.
CACHE_ARG = ("cache" if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
             else "past_key_values")
PASSKEY_PROMPT = (FILLER * 14 + "The pass key is 68259. Remember it. 68259 is the pass key. " +
                  FILLER * 14 + "What is the pass key? The pass key is")


def worker_binary() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("KVC_WORKER", REPO / "build" / "worker" / "kvc-worker"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"kvc-worker not found at {path}: build it or set KVC_WORKER", pytrace=False)
    return path


def worker_ids(text: str, tmp_path: pathlib.Path) -> List[int]:
    """The project's tokenization (kvc-worker tokenize, no special tokens)."""
    f = tmp_path / "prompt.txt"
    f.write_text(text)
    out = subprocess.check_output([str(worker_binary()), "tokenize", "--text-file", str(f)],
                                  text=True, timeout=60)
    return [int(x) for x in out.split()]


def worker_passkey_int4(server: Server, tmp_path: pathlib.Path,
                        policy: str) -> Tuple[str, float, int]:
    """`kvc-worker generate` on PASSKEY_PROMPT with `policy` + INT4, its KV in `server`'s
    smollm2-f16 pool, 12 new tokens: (its answer, the bytes kvcached held, for how many
    tokens)."""
    prompt = tmp_path / "passkey.txt"
    prompt.write_text(PASSKEY_PROMPT)
    run = subprocess.run(
        [str(worker_binary()), "generate", f"--prompt-file={prompt}", "--raw", "--kv", "kvcached",
         "--target", server.target, "--pool", "smollm2-f16", "--policy", policy,
         "--storage", "int4", "--max-new-tokens", "12", "--model", str(MODEL_DIR / GGUF)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    held = re.search(r"kvcached holds ([0-9.]+) MB of int4_g32 blocks for (\d+) tokens",
                     run.stderr)
    assert held, run.stderr
    return run.stdout, float(held.group(1)) * 1e6, int(held.group(2))


@pytest.fixture(scope="module")
def model() -> "transformers.PreTrainedModel":
    if not (MODEL_DIR / GGUF).is_file():
        pytest.fail(f"{MODEL_DIR / GGUF} is missing: run scripts/fetch_model.sh", pytrace=False)
    m = transformers.AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), gguf_file=GGUF)
    m.eval()
    return m


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp("kvcached-hf"), HF_POOLS)
    yield s
    s.stop()


@pytest.fixture()
def hf_client(hf_server: Server) -> Iterator[kvcache.Client]:
    with kvcache.Client(hf_server.target, timeout=60) as c:
        yield c


@pytest.mark.parametrize("pool,decode", [("smollm2-f32", "fetch"), ("smollm2-f16", "fetch"),
                                         ("smollm2-f32", "attend"), ("smollm2-f16", "attend")])
def test_greedy_tokens_equal_dynamic_cache(model, hf_server, hf_client, pool, decode, tmp_path):
    ids = worker_ids("The capital of France is Paris. The capital of Italy is", tmp_path)
    x = torch.tensor([ids])
    implementation = model.config._attn_implementation
    with torch.no_grad():
        want = model.generate(x, max_new_tokens=16, do_sample=False,
                              **{CACHE_ARG: transformers.DynamicCache()})
    with kvcache.hf.KvcachedCache(model, hf_client, pool=pool, decode=decode) as cache:
        fetches = hf_server.rpc_count("Fetch")
        with torch.no_grad():
            got = model.generate(x, max_new_tokens=16, do_sample=False, **{CACHE_ARG: cache})
        fetches = hf_server.rpc_count("Fetch") - fetches
        info = hf_client.get_sequence(cache.sequence)
        seq = cache.sequence
    assert got.tolist() == want.tolist()
    # The prefill reads every layer back once (30 layers); fetch also does so at each of the
    # 15 decode steps, attend never: the cache stays in kvcached.
    assert fetches == (30 if decode == "attend" else 30 * 16)
    assert model.config._attn_implementation == implementation  # restored by close()
    # The KV lived in kvcached: every token but the last generated one was appended there.
    assert info.visible_tokens == len(ids) + 15
    with pytest.raises(kvcache.NotFound):  # close() released it
        hf_client.get_sequence(seq)


def test_a_chunk_after_eviction_sees_the_kept_tokens_causally(model, hf_client, tmp_path):
    """After eviction the cache holds fewer tokens than positions: a multi-token chunk must
    give the same logits as feeding its tokens one by one (the mask's kv offset)."""
    ids = worker_ids(FILLER * 4, tmp_path)
    chunk = worker_ids(" What colour is the sky? It is", tmp_path)
    spec = kvcache.CompressionSpec(eviction=kvcache.StreamingLLM(sinks=4, window=16))
    logits = []
    for stepwise in (False, True):
        with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32") as cache:
            with torch.no_grad():
                model(torch.tensor([ids]), **{CACHE_ARG: cache})
                cache.compress(spec)
                assert [layer.kept for layer in cache.layers] == [20] * 30
                if stepwise:
                    rows = [model(torch.tensor([[t]]), **{CACHE_ARG: cache}).logits[0, -1]
                            for t in chunk]
                    logits.append(torch.stack(rows))
                else:
                    logits.append(model(torch.tensor([chunk]), **{CACHE_ARG: cache}).logits[0])
            assert cache.get_seq_length() == len(ids) + len(chunk)
    torch.testing.assert_close(logits[0], logits[1], atol=2e-4, rtol=1e-4)


def test_passkey_with_snapkv_int4_answers_as_the_worker(model, hf_client, hf_server, tmp_path):
    ids = worker_ids(PASSKEY_PROMPT, tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR), gguf_file=GGUF)
    spec = kvcache.CompressionSpec(eviction=kvcache.SnapKV(window=32, budget=64),
                                   storage="int4_g32")
    with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f16", compression=spec) as cache:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                 **{CACHE_ARG: cache})
        info = hf_client.get_sequence(cache.sequence)
        assert cache.compressed
    answer = tokenizer.decode(out[0, len(ids):])
    assert "68259" in answer
    assert list(info.stored_tokens) == [64 + 11] * 90  # budget + the decoded tokens appended
    # kvc-worker with the same settings, against the same kvcached.
    text, held_bytes, tokens = worker_passkey_int4(hf_server, tmp_path, "snapkv=64/32")
    assert "68259" in text
    # Same kept tokens, same format: the same bytes (the worker also appended the 12th token).
    assert tokens == len(ids) + 11
    assert abs(held_bytes - info.bytes) <= 1e3
    assert answer.split(".")[0] == text.split(".")[0]


def test_attend_decode_answers_as_fetch_on_a_compressed_cache(model, hf_server, hf_client,
                                                             tmp_path):
    """decode='attend' over a SnapKV + INT4 cache: kvcached's Attend reads the same stored
    blocks Fetch would hand to transformers, so the greedy tokens are the same, and no layer
    is fetched after the prefill."""
    ids = torch.tensor([worker_ids(PASSKEY_PROMPT, tmp_path)])
    spec = kvcache.CompressionSpec(eviction=kvcache.SnapKV(window=32, budget=64),
                                   storage="int4_g32")
    out = {}
    for decode in ("fetch", "attend"):
        with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f16", compression=spec,
                                      decode=decode) as cache:
            fetches = hf_server.rpc_count("Fetch")
            with torch.no_grad():
                out[decode] = model.generate(ids, max_new_tokens=12, do_sample=False,
                                             **{CACHE_ARG: cache}).tolist()
            fetches = hf_server.rpc_count("Fetch") - fetches
            assert cache.compressed
        # the prefill; fetch also reads every layer after the compression and at each of the
        # 11 decode steps after the first
        assert fetches == (30 if decode == "attend" else 2 * 30 + 11 * 30)
    assert out["attend"] == out["fetch"]


def test_adaptive_budgets_decode_through_attend_as_the_worker(model, hf_server, hf_client,
                                                             tmp_path):
    """AdaKV budgets leave a layer's kv heads at different lengths: transformers' attention
    cannot take them (decode='fetch' refuses), kvcached's Attend can. The answer and the bytes
    held are kvc-worker's with the same policy against the same kvcached."""
    ids = worker_ids(PASSKEY_PROMPT, tmp_path)
    spec = kvcache.CompressionSpec(eviction=kvcache.SnapKV(window=32, budget=64, adaptive=True),
                                   storage="int4_g32")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR), gguf_file=GGUF)
    with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f16", compression=spec) as cache:
        with torch.no_grad(), pytest.raises(NotImplementedError, match="different token counts"):
            model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                           **{CACHE_ARG: cache})
    with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f16", compression=spec,
                                  decode="attend") as cache:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                 **{CACHE_ARG: cache})
        info = hf_client.get_sequence(cache.sequence)
    stored = list(info.stored_tokens)
    assert len(set(stored)) > 1  # the heads really differ
    assert sum(stored) == (64 + 11) * 90  # the same total budget, + the decoded tokens
    answer = tokenizer.decode(out[0, len(ids):])
    text, held_bytes, _ = worker_passkey_int4(hf_server, tmp_path, "adasnapkv=64/32")
    assert abs(held_bytes - info.bytes) <= 1e3
    assert answer.split(".")[0] == text.split(".")[0], (answer, text)


def test_attend_decode_refuses_what_it_cannot_serve(model, hf_client):
    with pytest.raises(ValueError, match="decode='fast'; expected 'fetch' or 'attend'"):
        kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32", decode="fast")
    implementation = model.config._attn_implementation
    with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32", decode="attend"):
        # A second attend cache would take the model's attention from the first.
        with pytest.raises(ValueError, match="already has an open KvcachedCache"):
            kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32", decode="attend")
    assert model.config._attn_implementation == implementation


def test_another_cache_on_the_same_model_is_not_served_by_attend(model, hf_server, hf_client,
                                                                 tmp_path):
    """While an attend cache is open, the model decoding with a DynamicCache still attends to
    its own cache (the wrapper serves only forwards given the attend cache)."""
    x = torch.tensor([worker_ids("The capital of France is Paris. The capital of Italy is",
                                 tmp_path)])
    with torch.no_grad():
        want = model.generate(x, max_new_tokens=8, do_sample=False,
                              **{CACHE_ARG: transformers.DynamicCache()})
        with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32",
                                      decode="attend") as cache:
            model(x, **{CACHE_ARG: cache})  # prefilled: its next single token would attend
            got = model.generate(x, max_new_tokens=8, do_sample=False,
                                 **{CACHE_ARG: transformers.DynamicCache()})
    assert got.tolist() == want.tolist()


def test_the_gguf_tokenizer_matches_the_workers_on_numbers(tmp_path):
    """The transformers tokenizer built from the GGUF once dropped SmolLM2's digit splitting;
    these tests feed kvc-worker's ids anyway, and this one says whether the two agree."""
    text = "In 1999, 12345 people paid $3.50 each; call 555-0100. The pass key is 71432."
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR), gguf_file=GGUF)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == worker_ids(text, tmp_path)


def test_refusals(model, hf_client):
    with pytest.raises(ValueError, match="has no pool 'nope'"):
        kvcache.hf.KvcachedCache(model, hf_client, pool="nope")
    with pytest.raises(ValueError, match=r"the model needs \(30, 3, 9, 64\)"):
        kvcache.hf.KvcachedCache(model, hf_client, pool="f16")
    spec = kvcache.CompressionSpec(eviction=kvcache.SnapKV(window=8, budget=16))
    with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32", compression=spec) as cache:
        with pytest.raises(ValueError, match="needs the prompt's queries"):
            cache.compress()
        with pytest.raises(ValueError, match="batch size 2"):
            model(torch.zeros((2, 3), dtype=torch.long), **{CACHE_ARG: cache})


def test_worker_passkey_cases_out_is_the_grid_it_runs(tmp_path):
    """kvc-worker passkey --cases-out hands its grid to other engines (kvpress side by side):
    one line per (length, depth, key), the answer's tokens inside the context (the needle)."""
    out = tmp_path / "cases.jsonl"
    subprocess.run([str(worker_binary()), "passkey", "--lengths", "512,1024", "--depths",
                    "0,0.5,1", "--keys", "2", "--cases-out", str(out), "--model",
                    str(MODEL_DIR / GGUF)], check=True, timeout=120, capture_output=True)
    cases = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(c["length"], c["depth"], c["key_index"]) for c in cases] == [
        (n, d, k) for n in (512, 1024) for d in (0, 0.5, 1) for k in (0, 1)]
    assert len({c["passkey"] for c in cases}) == len(cases)
    for c in cases:
        ctx, ans = c["context"], c["answer"]
        assert abs(len(ctx) - c["length"]) <= 8
        assert any(ctx[i:i + len(ans)] == ans for i in range(len(ctx))), c["passkey"]


@pytest.mark.parametrize("eviction,kept", [
    (kvcache.SnapKV(window=8, budget=24), 24),
    (kvcache.H2O(heavy=16, recent=8), 24),
    (kvcache.StreamingLLM(sinks=4, window=20), 24),
    (kvcache.ExpectedAttention(window=8, budget=24), 24),
])
def test_every_policy_compresses_at_the_first_decode_step(model, hf_client, eviction, kept,
                                                          tmp_path):
    """The queries (SnapKV: the window, H2O: all of them) or query statistics (Expected
    Attention) captured during the prefill reach kvcached, which keeps `kept` tokens per head;
    decoding then continues from the compressed cache."""
    ids = worker_ids(FILLER * 3, tmp_path)
    spec = kvcache.CompressionSpec(eviction=eviction, storage="int8")
    with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32", compression=spec) as cache:
        with torch.no_grad():
            model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                           **{CACHE_ARG: cache})
        assert cache.compressed
        info = hf_client.get_sequence(cache.sequence)
    assert list(info.stored_tokens) == [kept + 3] * 90  # + the 3 decoded tokens appended
    assert info.visible_tokens == len(ids) + 3


def test_a_failed_append_makes_the_cache_refuse_later_steps(model, hf_client, tmp_path):
    """The sequence is released behind the cache's back: the next forward fails with the
    service's NotFound, and every later one says the cache is unusable (never a mix of
    layers at different lengths)."""
    ids = worker_ids("The capital of France is", tmp_path)
    with kvcache.hf.KvcachedCache(model, hf_client, pool="smollm2-f32") as cache:
        with torch.no_grad():
            model(torch.tensor([ids]), **{CACHE_ARG: cache})
            hf_client.release(cache.sequence)
            with pytest.raises(kvcache.NotFound):
                model(torch.tensor([[ids[-1]]]), **{CACHE_ARG: cache})
            with pytest.raises(RuntimeError, match="unusable after an earlier failure"):
                model(torch.tensor([[ids[-1]]]), **{CACHE_ARG: cache})
    # Leaving the `with` released nothing more and raised nothing: the sequence was gone.
