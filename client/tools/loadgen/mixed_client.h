// One client of kvc-loadgen's mixed mode: loops over whole sequence lifetimes until the
// deadline, checking every fetched byte and recording every call in MixedState.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/tools/loadgen/kv_check.h"
#include "client/tools/loadgen/mixed_mode.h"
#include "client/tools/loadgen/mixed_state.h"
#include "kvc/client/kv_cache_client.h"

namespace kvc::loadgen {

class MixedClient {
 public:
  MixedClient(int id, client::KvCacheClient* client, const client::PoolInfo* pool,
              const MixedOptions* options, MixedState* state);
  void Run(absl::Time deadline);

 private:
  enum class Outcome { kContinue, kStop };
  // One sequence from CreateSequence to Release.
  Outcome OneSequence(uint64_t key);
  Outcome AppendAll(const std::string& id, uint64_t key, int tokens, bool* appended);
  Outcome FetchAndCheck(const std::string& id, const FetchExpectation& expect);
  Outcome CompressStreaming(const std::string& id, uint64_t key, int tokens);
  Outcome CompressSnapKv(const std::string& id, uint64_t key, int tokens);
  Outcome AttendOnce(const std::string& id, uint64_t key, int tokens);
  // Records the call and classifies its status: kStop when the server is gone (expected
  // loss) and the client must stop.
  Outcome Account(const char* rpc, absl::Time started, const absl::Status& status);
  FetchExpectation Expect(uint64_t key, int tokens) const;

  const int id_;
  client::KvCacheClient* const client_;
  const client::PoolInfo* const pool_;
  const MixedOptions* const options_;
  MixedState* const state_;
  std::mt19937_64 rng_;
};

}  // namespace kvc::loadgen
