// The device of the pools that test fixtures create, so one suite runs against host and
// device pools: KVC_TEST_POOL_DEVICE ("cuda:0" in the cudasim build's device-pool runs and in
// tests/gpu/run_service_gpu.sh on a GPU), "cpu" when unset.
#pragma once

#include <cstdlib>
#include <string>

namespace kvc::testing {

inline std::string TestPoolDevice() {
  const char* device = std::getenv("KVC_TEST_POOL_DEVICE");
  return device != nullptr && *device != '\0' ? device : "cpu";
}

}  // namespace kvc::testing
