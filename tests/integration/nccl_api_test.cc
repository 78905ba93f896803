// nccl_api.h against the machine's real NCCL (the CUDA toolkit's libnccl.so.2): loading it
// at run time, its unique id (made without a GPU: it names the bootstrap's socket), and the
// errors a machine without NCCL, or with something else under that name, gets.
#include "transfer/nccl_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace kvc::nccl {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(NcclApiTest, LoadsTheMachinesNcclAndMakesUniqueIds) {
  absl::StatusOr<const Api*> api = Load();
  ASSERT_TRUE(api.ok()) << api.status()
                        << "\n(this test needs NCCL: the CUDA toolkit's libnccl.so.2 on the "
                           "loader's path, as on the project's build machines)";
  EXPECT_GE((*api)->version, kMinVersion);
  EXPECT_THAT((*api)->Describe(), StartsWith("NCCL 2."));
  EXPECT_THAT((*api)->Describe(), HasSubstr("(libnccl.so.2)"));
  UniqueId a{}, b{};
  ASSERT_TRUE((*api)->Check((*api)->get_unique_id(&a), "ncclGetUniqueId").ok());
  ASSERT_TRUE((*api)->Check((*api)->get_unique_id(&b), "ncclGetUniqueId").ok());
  EXPECT_NE(std::memcmp(a.internal, b.internal, kUniqueIdBytes), 0) << "two ids are the same";
  // Loaded once: the same table again.
  absl::StatusOr<const Api*> again = Load("libnccl.so.2");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *api);
}

TEST(NcclApiTest, ErrorsCarryNcclsWordsAndTheCall) {
  absl::StatusOr<const Api*> api = Load();
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_TRUE((*api)->Check(kSuccess, "ncclSend").ok());
  const absl::Status failed = (*api)->Check(2, "ncclSend");  // ncclSystemError
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_THAT(Message(failed), StartsWith("ncclSend: "));
  EXPECT_THAT(Message(failed), HasSubstr("unhandled system error"));
  EXPECT_THAT(Message(failed), EndsWith(" (NCCL error 2)"));
}

TEST(NcclApiTest, AMissingLibraryIsAnErrorNamingIt) {
  for (int i = 0; i < 2; ++i) {  // the second answer comes from the first
    absl::StatusOr<const Api*> api = Load("libkvc-no-such-nccl.so.2");
    ASSERT_FALSE(api.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(api.status())) << api.status();
    EXPECT_THAT(Message(api.status()),
                HasSubstr("NCCL could not be loaded from libkvc-no-such-nccl.so.2: "));
    EXPECT_THAT(Message(api.status()), HasSubstr("cannot open shared object file"));
    EXPECT_THAT(Message(api.status()), HasSubstr("TCP transfers and same-node reads do not"));
  }
}

TEST(NcclApiTest, ALibraryThatIsNotNcclIsRefused) {
  absl::StatusOr<const Api*> api = Load("libc.so.6");
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(api.status())) << api.status();
  EXPECT_THAT(Message(api.status()), HasSubstr("it has no ncclGetVersion (not NCCL, or too old)"));
}

}  // namespace
}  // namespace kvc::nccl
