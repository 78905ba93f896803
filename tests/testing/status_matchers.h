// gMock matchers for absl::Status / StatusOr (Abseil 20220623 ships none).
//   EXPECT_THAT(store.Append(p), StatusIs(absl::StatusCode::kInvalidArgument, "num_tokens"));
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvc::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.ok();
}

MATCHER_P(StatusIs, code, "has code " + ::testing::PrintToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

// The message must contain `substring` (a field name, a number the user must see).
MATCHER_P2(StatusIs, code, substring,
           "has code " + ::testing::PrintToString(code) + " and a message containing \"" +
               std::string(substring) + "\"") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code && std::string(s.message()).find(substring) != std::string::npos;
}

}  // namespace kvc::testing

#define KVC_ASSERT_OK(expr) ASSERT_THAT((expr), ::kvc::testing::IsOk())
#define KVC_EXPECT_OK(expr) EXPECT_THAT((expr), ::kvc::testing::IsOk())

#define KVC_TESTING_CONCAT_INNER_(a, b) a##b
#define KVC_TESTING_CONCAT_(a, b) KVC_TESTING_CONCAT_INNER_(a, b)
#define KVC_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  KVC_ASSERT_OK_AND_ASSIGN_IMPL_(KVC_TESTING_CONCAT_(kvc_statusor_, __LINE__), lhs, expr)
#define KVC_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  ASSERT_THAT(statusor, ::kvc::testing::IsOk());            \
  lhs = *std::move(statusor)
