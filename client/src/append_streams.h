// The two AppendStreams (over gRPC: one client stream; on the same node: staged Appends in
// flight, see StagedAppendStream in the .cc) and the staging helpers Append shares with them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/src/client_impl.h"
#include "client/src/staging_space.h"
#include "kvc/client/kv_cache_client.h"
#include "kvcache/v1/kvcache_service.pb.h"

namespace kvc::client::internal {

int64_t RoundUp64(int64_t n);

// Codes with which an Append can end while the server may still be reading its staged bytes
// (the client gave up or lost the answer, not the server refusing).
bool ServerMayStillRead(const absl::Status& status);

// Copies the chunk's keys and values into a slot of `staging` and makes `request` an Append
// that points at them; nothing (request untouched) when no free run of the region is that long.
std::optional<StagingSpace::Slot> Stage(StagingSpace& staging, const AppendChunk& chunk,
                                        ::kvcache::v1::AppendRequest* request);

std::unique_ptr<AppendStream> MakeGrpcAppendStream(const KvCacheClient::Impl& impl,
                                                   const CallOptions& call);
std::unique_ptr<AppendStream> MakeStagedAppendStream(const KvCacheClient::Impl& impl,
                                                     std::shared_ptr<StagingSpace> staging,
                                                     absl::Duration deadline);

}  // namespace kvc::client::internal
