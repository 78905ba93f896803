// kvc-worker's --policy / --storage flags -> the CompressionSpecs sent to kvcached.
#include "worker/service/service_policy_parse.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvc::worker {
namespace {

using client::StorageFormat;
using ::kvc::testing::StatusIs;

TEST(ServicePolicyParseTest, StorageWithARawResidual) {
  KVC_ASSERT_OK_AND_ASSIGN(ServicePolicy p, ParseServicePolicy("snapkv=256", "int4+raw32"));
  EXPECT_TRUE(p.compress_at_prompt_end);
  EXPECT_EQ(p.at_prompt_end.storage, StorageFormat::kInt4G32);
  EXPECT_EQ(p.at_prompt_end.residual_tokens, 32);  // set when the prompt is still raw
  EXPECT_EQ(p.automatic.residual_tokens, 0);
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("streaming=4+252", "fp8+raw64"));
  EXPECT_EQ(p.automatic.storage, StorageFormat::kFp8E4M3);
  EXPECT_EQ(p.automatic.residual_tokens, 64);
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("", "int8"));
  EXPECT_EQ(p.automatic.storage, StorageFormat::kInt8);
  EXPECT_EQ(p.automatic.residual_tokens, 0);
}

TEST(ServicePolicyParseTest, AdaptiveAndPyramidSnapKv) {
  KVC_ASSERT_OK_AND_ASSIGN(ServicePolicy p, ParseServicePolicy("snapkv=256/64", ""));
  EXPECT_FALSE(p.at_prompt_end.adaptive);
  EXPECT_EQ(p.at_prompt_end.pyramid_beta, 0);
  EXPECT_EQ(p.query_window, 64);
  EXPECT_EQ(p.at_prompt_end.pooling_kernel, 13);
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("snapkv=256/16/1", ""));
  EXPECT_EQ(p.at_prompt_end.window, 16);
  EXPECT_EQ(p.at_prompt_end.pooling_kernel, 1);
  EXPECT_THAT(ParseServicePolicy("snapkv=256/16/1/4", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "malformed"));
  EXPECT_THAT(ParseServicePolicy("h2o=256", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "malformed"));
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("adasnapkv=256", "int4"));
  EXPECT_TRUE(p.at_prompt_end.adaptive);
  EXPECT_EQ(p.at_prompt_end.head_floor_percent, -1);  // the server's default
  EXPECT_EQ(p.at_prompt_end.budget, 256);
  EXPECT_EQ(p.at_prompt_end.window, 32);
  EXPECT_EQ(p.at_prompt_end.pyramid_beta, 0);
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("pyramidkv=256", ""));
  EXPECT_FALSE(p.at_prompt_end.adaptive);
  EXPECT_EQ(p.at_prompt_end.pyramid_beta, 20);
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("adapyramidkv=128/16", ""));
  EXPECT_TRUE(p.at_prompt_end.adaptive);
  EXPECT_EQ(p.at_prompt_end.pyramid_beta, 20);
  EXPECT_EQ(p.at_prompt_end.window, 16);
  EXPECT_THAT(ParseServicePolicy("xsnapkv=128", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "adasnapkv="));
}

TEST(ServicePolicyParseTest, ExpectedAttention) {
  using Eviction = client::CompressionSpec::Eviction;
  KVC_ASSERT_OK_AND_ASSIGN(ServicePolicy p, ParseServicePolicy("expattn=256", ""));
  EXPECT_TRUE(p.compress_at_prompt_end);
  EXPECT_TRUE(p.query_agnostic());
  EXPECT_EQ(p.at_prompt_end.eviction, Eviction::kExpectedAttention);
  EXPECT_EQ(p.at_prompt_end.budget, 256);  // sinks and window included
  EXPECT_EQ(p.at_prompt_end.window, 32);   // as SnapKV's
  EXPECT_EQ(p.at_prompt_end.sinks, 4);     // named: the worker's statistics leave them out
  EXPECT_EQ(p.sinks(), 4);
  EXPECT_FALSE(p.at_prompt_end.adaptive);
  EXPECT_EQ(p.at_prompt_end.storage, StorageFormat::kPoolDefault);
  EXPECT_EQ(p.automatic.eviction, Eviction::kNone);  // nothing runs on every append
  EXPECT_EQ(p.query_window, 0);                      // no observation window to keep
  // With a storage format (passkey's expattn=256:int4 is this) and a raw residual.
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("expattn=128/16", "int4+raw16"));
  EXPECT_EQ(p.at_prompt_end.budget, 128);
  EXPECT_EQ(p.at_prompt_end.window, 16);
  EXPECT_EQ(p.at_prompt_end.storage, StorageFormat::kInt4G32);
  EXPECT_EQ(p.at_prompt_end.residual_tokens, 16);
  EXPECT_EQ(p.automatic.storage, StorageFormat::kPoolDefault);  // prefill stays raw
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("expattn=64/0", "fp8"));
  EXPECT_EQ(p.at_prompt_end.window, 0);  // kvpress's: sinks only
  // AdaKV: the layer's budget shared across its kv heads by score.
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("adaexpattn=256", "int4"));
  EXPECT_TRUE(p.query_agnostic());
  EXPECT_TRUE(p.at_prompt_end.adaptive);
  EXPECT_EQ(p.at_prompt_end.head_floor_percent, -1);  // the server's default
  EXPECT_EQ(p.at_prompt_end.budget, 256);
  EXPECT_EQ(p.at_prompt_end.window, 32);
  EXPECT_EQ(p.at_prompt_end.storage, StorageFormat::kInt4G32);
  // SnapKV and H2O are not query-agnostic.
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("snapkv=256", ""));
  EXPECT_FALSE(p.query_agnostic());
  KVC_ASSERT_OK_AND_ASSIGN(p, ParseServicePolicy("h2o=128+128", ""));
  EXPECT_FALSE(p.query_agnostic());
}

TEST(ServicePolicyParseTest, BadExpectedAttention) {
  using absl::StatusCode;
  EXPECT_THAT(ParseServicePolicy("expattn=", ""),
              StatusIs(StatusCode::kInvalidArgument, "bad number ''"));
  EXPECT_THAT(ParseServicePolicy("expattn=x", ""),
              StatusIs(StatusCode::kInvalidArgument, "bad number 'x'"));
  EXPECT_THAT(ParseServicePolicy("expattn=-5", ""),
              StatusIs(StatusCode::kInvalidArgument, "bad number '-5'"));
  EXPECT_THAT(ParseServicePolicy("expattn=256/32/7", ""),
              StatusIs(StatusCode::kInvalidArgument, "malformed"));
  // The budget holds the 4 sinks and the window and leaves room to choose.
  EXPECT_THAT(ParseServicePolicy("expattn=36", ""),
              StatusIs(StatusCode::kInvalidArgument, "must exceed the 4 sinks + the window (32)"));
  EXPECT_THAT(ParseServicePolicy("expattn=20/16", ""),
              StatusIs(StatusCode::kInvalidArgument, "must exceed"));
  KVC_EXPECT_OK(ParseServicePolicy("expattn=37", ""));
  EXPECT_THAT(ParseServicePolicy("xexpattn=128", ""),
              StatusIs(StatusCode::kInvalidArgument, "adaexpattn="));
  EXPECT_THAT(ParseServicePolicy("expattn=256", "int3"),
              StatusIs(StatusCode::kInvalidArgument, "unknown --storage"));
  // The list of policies names it.
  EXPECT_THAT(ParseServicePolicy("expected=256", ""),
              StatusIs(StatusCode::kInvalidArgument, "[ada]expattn=BUDGET[/WINDOW]"));
}

TEST(ServicePolicyParseTest, BadFlagsSayWhatIsExpected) {
  EXPECT_THAT(ParseServicePolicy("", "int4+raw"),
              StatusIs(absl::StatusCode::kInvalidArgument, "number of raw recent tokens"));
  EXPECT_THAT(ParseServicePolicy("", "int3"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown --storage 'int3'"));
  EXPECT_THAT(ParseServicePolicy("snapkv=x", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad number 'x'"));
}

// --storage takes every format by the name the client prints (the kernels' table), so a new
// format is usable from the worker without touching the parser.
TEST(ServicePolicyParseTest, EveryFormatByItsName) {
  int formats = 0;
  for (int v = 1; std::string(client::StorageFormatName(static_cast<StorageFormat>(v))) != "?";
       ++v, ++formats) {
    const auto format = static_cast<StorageFormat>(v);
    const std::string name = client::StorageFormatName(format);
    KVC_ASSERT_OK_AND_ASSIGN(const ServicePolicy p, ParseServicePolicy("snapkv=256", name));
    EXPECT_EQ(p.at_prompt_end.storage, format) << name;
  }
  EXPECT_EQ(formats, 8);
  EXPECT_FALSE(ParseServicePolicy("snapkv=256", "int3").ok());
}

}  // namespace
}  // namespace kvc::worker
