#include "client/tools/loadgen/mixed_client.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tools/loadgen/kv_check.h"
#include "client/tools/loadgen/kv_pattern.h"
#include "kvc/client/admin_client.h"

namespace kvc::loadgen {
namespace {

using client::AppendChunk;
using client::CompressionSpec;
using client::DType;
using Kept = FetchExpectation::Kept;

void AtomicMax(std::atomic<int64_t>* a, int64_t v) {
  int64_t seen = a->load();
  while (seen < v && !a->compare_exchange_weak(seen, v)) {
  }
}

}  // namespace

MixedClient::MixedClient(int id, client::KvCacheClient* client, const client::PoolInfo* pool,
                         const MixedOptions* options, MixedState* state)
    : id_(id),
      client_(client),
      pool_(pool),
      options_(options),
      state_(state),
      rng_(options->seed * 1000003u + static_cast<uint64_t>(id)) {}

void MixedClient::Run(absl::Time deadline) {
  // Sequence keys: the client in the high bits, so no two clients write the same pattern.
  for (uint64_t n = 0; absl::Now() < deadline; ++n) {
    const uint64_t key = (static_cast<uint64_t>(id_) + 1) << 40 | n;
    if (OneSequence(key) == Outcome::kStop) return;
  }
}

MixedClient::Outcome MixedClient::Account(const char* rpc, absl::Time started,
                                          const absl::Status& status) {
  const absl::Time returned = absl::Now();
  state_->rpcs.Record(rpc, returned - started, status.code());
  AtomicMax(&state_->last_return_unix_ms, absl::ToUnixMillis(returned));
  if (status.ok()) return Outcome::kContinue;
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    ++state_->resource_exhausted;
    const PoolFullMessage m = ParsePoolFull(status);
    if (!m.documented) {
      ++state_->unexpected;
      state_->Note(&state_->unexpected_examples, absl::StrCat(rpc, ": ", status.ToString()));
      return Outcome::kContinue;
    }
    ++state_->re_documented;
    // Full as the server saw it: the request needed more than was free.
    if (m.needed_bytes > m.free_bytes && m.capacity_bytes == pool_->capacity_bytes) {
      ++state_->re_pool_full;
    }
    state_->Note(&state_->re_examples, absl::StrCat(rpc, ": ", status.message()));
    {
      kvc::MutexLock lock(&state_->mu);
      state_->re_free_bytes.push_back(m.free_bytes);
    }
    auto stats = kvc::client::AdminClient::Over(*client_).GetPoolStats(pool_->name);
    if (stats.ok() && stats->capacity_bytes > 0) {
      kvc::MutexLock lock(&state_->mu);
      state_->re_used_fraction.push_back(static_cast<double>(stats->used_bytes) /
                                         static_cast<double>(stats->capacity_bytes));
    }
    return Outcome::kContinue;
  }
  if (options_->expect_server_loss && (status.code() == absl::StatusCode::kUnavailable ||
                                       status.code() == absl::StatusCode::kDeadlineExceeded)) {
    if (state_->clients_lost++ == 0) state_->first_loss_unix_ms = absl::ToUnixMillis(returned);
    return Outcome::kStop;
  }
  ++state_->unexpected;
  state_->Note(&state_->unexpected_examples, absl::StrCat(rpc, ": ", status.ToString()));
  return Outcome::kContinue;
}

FetchExpectation MixedClient::Expect(uint64_t key, int tokens) const {
  FetchExpectation e;
  e.sequence_key = key;
  e.num_layers = pool_->geometry.num_layers;
  e.num_heads = pool_->geometry.num_kv_heads;
  e.head_dim = pool_->geometry.head_dim;
  e.visible_tokens = tokens;
  return e;
}

MixedClient::Outcome MixedClient::OneSequence(uint64_t key) {
  // Log-uniform lengths: many short sequences, a few long ones, as a serving mix has.
  std::uniform_real_distribution<double> log_len(std::log(options_->min_tokens),
                                                 std::log(options_->max_tokens));
  const int tokens = std::max(1, static_cast<int>(std::exp(log_len(rng_))));
  client::CreateSequenceOptions create;
  create.pool = pool_->name;
  create.tenant = options_->tenant;
  absl::Time t0 = absl::Now();
  auto seq = client_->CreateSequence(create);
  if (Account("CreateSequence", t0, seq.status()) == Outcome::kStop) return Outcome::kStop;
  if (!seq.ok()) {
    absl::SleepFor(absl::Milliseconds(20));  // a full pool: let others release
    return Outcome::kContinue;
  }
  const std::string& id = seq->sequence_id;
  ++state_->sequences;
  bool appended = false;
  if (AppendAll(id, key, tokens, &appended) == Outcome::kStop) return Outcome::kStop;
  if (appended) {
    if (FetchAndCheck(id, Expect(key, tokens)) == Outcome::kStop) return Outcome::kStop;
    if (rng_() % 2 == 0) {
      FetchExpectation stored = Expect(key, tokens);
      stored.stored_format = true;
      if (FetchAndCheck(id, stored) == Outcome::kStop) return Outcome::kStop;
    }
    Outcome next = Outcome::kContinue;
    switch (rng_() % 4) {
      case 0:
        next = CompressStreaming(id, key, tokens);
        break;
      case 1:
        next = CompressSnapKv(id, key, tokens);
        break;
      case 2:
        next = AttendOnce(id, key, tokens);
        break;
      default:
        break;
    }
    if (next == Outcome::kStop) return Outcome::kStop;
  } else {
    absl::SleepFor(absl::Milliseconds(20));  // refused for a full pool
  }
  t0 = absl::Now();
  auto released = client_->Release(id);
  return Account("Release", t0, released.status());
}

MixedClient::Outcome MixedClient::AppendAll(const std::string& id, uint64_t key, int tokens,
                                            bool* appended) {
  const auto& g = pool_->geometry;
  const absl::Time t0 = absl::Now();
  auto stream = client_->StartAppendStream();
  std::string keys, values;
  for (int start = 0; start < tokens; start += options_->chunk_tokens) {
    const int n = std::min(options_->chunk_tokens, tokens - start);
    bool broken = false;
    for (int l = 0; l < g.num_layers && !broken; ++l) {
      keys = PatternTokens(key, l, start, n, g.num_kv_heads, g.head_dim, /*is_value=*/false);
      values = PatternTokens(key, l, start, n, g.num_kv_heads, g.head_dim, /*is_value=*/true);
      AppendChunk c;
      c.sequence_id = id;
      c.layer = l;
      c.start_position = start;
      c.num_tokens = n;
      c.dtype = DType::kF16;
      c.keys = keys.data();
      c.values = values.data();
      c.bytes = keys.size();
      broken = !stream->Write(c).ok();  // Finish() says why
    }
    if (broken) break;
  }
  auto result = stream->Finish();
  if (Account("AppendStream", t0, result.status()) == Outcome::kStop) return Outcome::kStop;
  if (result.ok()) {
    if (result->visible_tokens != tokens) {
      ++state_->unexpected;
      state_->Note(&state_->unexpected_examples,
                   absl::StrCat("AppendStream: OK with ", result->visible_tokens,
                                " visible tokens; sent ", tokens));
      return Outcome::kContinue;
    }
    *appended = true;
    state_->appended_tokens += tokens;
    state_->appended_bytes += int64_t{2} * tokens * g.num_layers * g.num_kv_heads * g.head_dim * 2;
  }
  return Outcome::kContinue;
}

MixedClient::Outcome MixedClient::FetchAndCheck(const std::string& id,
                                                const FetchExpectation& expect) {
  client::FetchOptions fetch;
  fetch.stored_format = expect.stored_format;
  fetch.dtype = expect.stored_format ? DType::kPoolDefault : DType::kF16;
  const absl::Time t0 = absl::Now();
  auto result = client_->Fetch(id, fetch);
  const char* rpc = expect.stored_format ? "Fetch(stored)" : "Fetch(dense)";
  if (Account(rpc, t0, result.status()) == Outcome::kStop) return Outcome::kStop;
  if (!result.ok()) return Outcome::kContinue;
  // An OK Fetch must be exactly right, during a server kill too.
  const FetchCheck check = CheckFetch(*result, expect);
  ++state_->fetches_checked;
  state_->rows_verified += check.tokens_checked;
  state_->wrong_bytes += check.wrong_bytes;
  state_->missing_rows += check.missing_rows;
  for (const auto& h : result->heads) {
    state_->fetched_bytes += static_cast<int64_t>(h.keys.size() + h.values.size());
  }
  if (!check.ok()) {
    ++state_->bad_fetches;
    state_->Note(&state_->problems, absl::StrCat(rpc, " of ", id, ": ", check.first_problem));
  }
  return Outcome::kContinue;
}

MixedClient::Outcome MixedClient::CompressStreaming(const std::string& id, uint64_t key,
                                                    int tokens) {
  // StreamingLLM keeps a known set: the first `sinks` and the last `window` positions.
  constexpr int kSinks = 4;
  const int window = std::max(16, tokens / 4);
  if (tokens <= kSinks + window) return Outcome::kContinue;
  const absl::Time t0 = absl::Now();
  auto result = client_->Compress(id, CompressionSpec::StreamingLlm(kSinks, window));
  if (Account("Compress(streaming)", t0, result.status()) == Outcome::kStop) {
    return Outcome::kStop;
  }
  if (!result.ok()) return Outcome::kContinue;
  ++state_->compressions;
  FetchExpectation e = Expect(key, tokens);
  e.kept = Kept::kExact;
  for (int p = 0; p < kSinks; ++p) e.positions.push_back(p);
  for (int p = tokens - window; p < tokens; ++p) e.positions.push_back(p);
  return FetchAndCheck(id, e);
}

MixedClient::Outcome MixedClient::CompressSnapKv(const std::string& id, uint64_t key, int tokens) {
  // SnapKV keeps `budget` tokens per kv head, chosen by score, and always its window.
  constexpr int kWindow = 16;
  const int budget = std::max(2 * kWindow, tokens / 2);
  if (tokens <= budget) return Outcome::kContinue;
  const auto& g = pool_->geometry;
  std::vector<std::string> data(static_cast<size_t>(g.num_layers));
  std::vector<client::LayerQueries> queries;
  for (int l = 0; l < g.num_layers; ++l) {
    // Query vectors [window, query heads, head_dim]: the pattern of another key.
    data[static_cast<size_t>(l)] =
        PatternTokens(~key, l, tokens - kWindow, kWindow, g.num_query_heads, g.head_dim,
                      /*is_value=*/false);
    client::LayerQueries q;
    q.layer = l;
    q.dtype = DType::kF16;
    q.queries = data[static_cast<size_t>(l)].data();
    q.bytes = data[static_cast<size_t>(l)].size();
    for (int p = tokens - kWindow; p < tokens; ++p) q.positions.push_back(p);
    queries.push_back(std::move(q));
  }
  const absl::Time t0 = absl::Now();
  auto result = client_->Compress(id, CompressionSpec::SnapKv(kWindow, budget), queries);
  if (Account("Compress(snapkv)", t0, result.status()) == Outcome::kStop) return Outcome::kStop;
  if (!result.ok()) return Outcome::kContinue;
  ++state_->compressions;
  FetchExpectation e = Expect(key, tokens);
  e.kept = Kept::kSubset;
  e.count = budget;
  for (int p = tokens - kWindow; p < tokens; ++p) e.positions.push_back(p);
  return FetchAndCheck(id, e);
}

MixedClient::Outcome MixedClient::AttendOnce(const std::string& id, uint64_t key, int tokens) {
  const auto& g = pool_->geometry;
  const std::string query = PatternTokens(~key, 0, tokens, 1, g.num_query_heads, g.head_dim,
                                          /*is_value=*/false);
  client::AttendRequest request;
  request.sequence_id = id;
  request.layer = static_cast<int>(rng_() % static_cast<uint64_t>(g.num_layers));
  request.dtype = DType::kF16;
  request.queries = query.data();
  request.bytes = query.size();
  request.positions = {tokens};  // the next decode position
  const absl::Time t0 = absl::Now();
  auto result = client_->Attend(request);
  if (Account("Attend", t0, result.status()) == Outcome::kStop) return Outcome::kStop;
  if (!result.ok()) return Outcome::kContinue;
  ++state_->attends;
  // An attention output is a convex mix of values in 0.125..2 in magnitude: finite f16.
  const size_t want = static_cast<size_t>(g.num_query_heads) * g.head_dim * 2;
  bool finite = result->output.size() == want;
  for (size_t i = 0; finite && i + 1 < result->output.size(); i += 2) {
    const auto hi = static_cast<uint8_t>(result->output[i + 1]);
    finite = (hi & 0x7c) != 0x7c;  // exponent all ones: Inf or NaN
  }
  if (!finite) {
    ++state_->bad_fetches;
    state_->Note(&state_->problems,
                 absl::StrCat("Attend of ", id, ": ", result->output.size(), " bytes (expected ",
                              want, ") or a non-finite element"));
  }
  return Outcome::kContinue;
}

}  // namespace kvc::loadgen
