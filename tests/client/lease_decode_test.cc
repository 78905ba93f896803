// A lease naming a storage format or dtype this client does not know (what a newer server may
// grant) is never decoded as something else: CheckDecodable says UNIMPLEMENTED naming it, and
// ReadLeased / ReadLeasedInto return that before they look at any block. (The client's
// kernel mapping used to turn every unknown format into f16.) The leased read path falls back
// to gRPC on it (client/src/leased_read_path.cc).
#include "client/src/lease_decode.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvc::client::internal {
namespace {

Lease OneLaneLease(StorageFormat format, DType dtype) {
  Lease l;
  l.lease_id = "l-test";
  l.block_tokens = 16;
  l.head_dim = 8;
  l.dtype = dtype;
  l.expires_unix_ms = int64_t{1} << 50;
  l.layers = {0};
  l.layer_tokens = {4};
  l.visible_tokens = 4;
  l.arenas.push_back({format, 16 * 2 * 8 * 2, 16, 0, 16 * 8 * 2, {}});
  l.lanes.push_back({0, 0, {{format, {0}, {0, 1, 2, 3}}}});
  return l;
}

TEST(LeaseDecodeTest, KnownFormatsAndDtypesAreDecodable) {
  for (const StorageFormat f :
       {StorageFormat::kF32, StorageFormat::kF16, StorageFormat::kBF16, StorageFormat::kFp8E4M3,
        StorageFormat::kInt8, StorageFormat::kInt4G32, StorageFormat::kInt4G64,
        StorageFormat::kNvfp4}) {
    EXPECT_TRUE(CheckDecodable(OneLaneLease(f, DType::kF16)).ok()) << static_cast<int>(f);
  }
}

TEST(LeaseDecodeTest, AnUnknownFormatOrDtypeIsNeverDecodedAsAnother) {
  const auto newer = static_cast<StorageFormat>(9);
  for (const Lease& lease :
       {OneLaneLease(newer, DType::kF16), OneLaneLease(StorageFormat::kPoolDefault, DType::kF16),
        OneLaneLease(StorageFormat::kF16, static_cast<DType>(7))}) {
    const absl::Status checked = CheckDecodable(lease);
    EXPECT_EQ(checked.code(), absl::StatusCode::kUnimplemented) << checked;
    EXPECT_NE(checked.message().find("which this client cannot decode"), std::string::npos);
    bool looked = false;
    const ArenaLookup arenas = [&](StorageFormat) -> absl::StatusOr<ArenaView> {
      looked = true;
      return absl::InternalError("not to be read");
    };
    int chunks = 0;
    FetchOptions fetch;
    fetch.dtype = DType::kF16;
    EXPECT_EQ(ReadLeased(lease, fetch, arenas,
                         [&](FetchedChunk&) {
                           ++chunks;
                           return absl::OkStatus();
                         })
                  .code(),
              absl::StatusCode::kUnimplemented);
    std::string keys(16 * 8 * 2, 'k'), values(16 * 8 * 2, 'v');
    FetchIntoOptions into;
    into.dtype = DType::kF16;
    into.num_kv_heads = 1;
    into.head_dim = 8;
    FetchIntoResult result;
    EXPECT_EQ(
        ReadLeasedInto(lease, {{0, keys.data(), values.data(), 16}}, into, arenas, &result).code(),
        absl::StatusCode::kUnimplemented);
    EXPECT_FALSE(looked) << "a block was looked up";
    EXPECT_EQ(chunks, 0);
    EXPECT_EQ(keys, std::string(16 * 8 * 2, 'k')) << "the buffers were written";
  }
}

}  // namespace
}  // namespace kvc::client::internal
