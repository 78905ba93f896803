// Flag values -> a ServicePolicy (what kvc-worker asks kvcached to do with its cache).
//   policy:  full | streaming=S+W | streaming-rerotate=S+W | [ada]snapkv=B[/W[/K]] |
//            [ada]pyramidkv=B[/W[/K]] | [ada]expattn=B[/W] | h2o=H+R
//            (expattn: Expected Attention, query-agnostic; B counts 4 sinks and W, default 32)
//   storage: f16 | bf16 | f32 | fp8 | int8 | int4 | int4g64 | nvfp4  (empty = pool dtype),
//            optionally +rawN: the newest N tokens of every lane stay raw (int4+raw32)
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/service/service_kv_cache.h"

namespace kvc::worker {

absl::StatusOr<ServicePolicy> ParseServicePolicy(const std::string& policy,
                                                 const std::string& storage);

}  // namespace kvc::worker
