// The kvcachectl flags that the cluster commands read. They are defined in
// kvcachectl_main.cc, with the others, so that --help lists every kvcachectl flag under that
// one file as before.
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, targets);
ABSL_DECLARE_FLAG(std::string, dns);
ABSL_DECLARE_FLAG(std::string, shard);
ABSL_DECLARE_FLAG(std::string, pool);
ABSL_DECLARE_FLAG(std::string, tenant);
ABSL_DECLARE_FLAG(int32_t, limit);
ABSL_DECLARE_FLAG(int32_t, timeout_ms);
ABSL_DECLARE_FLAG(std::string, sort);
