// The tests' precompiled header (tests/CMakeLists.txt, KVC_TEST_PCH): third-party and standard
// headers only, the ones most test files parse. Never a header of ours: a test names what it
// uses, and the include roots decide what it may reach.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
