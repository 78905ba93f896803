#include "cachesvc/core/pool/host_block_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using kernels::StorageFormat;
using ::kvc::testing::StatusIs;

constexpr int kDim = 64, kBlockTokens = 4;

int64_t BlockBytes(StorageFormat f) {
  return static_cast<int64_t>(kernels::MakeBlockLayout(f, kDim, kBlockTokens).block_bytes);
}

PoolOptions SmallPool(int64_t f16_blocks) {
  PoolOptions o;
  o.name = "p";
  o.geometry.num_layers = 2;
  o.geometry.num_kv_heads = 2;
  o.geometry.num_query_heads = 2;
  o.geometry.head_dim = kDim;
  o.geometry.block_tokens = kBlockTokens;
  o.capacity_bytes = f16_blocks * BlockBytes(StorageFormat::kF16);
  return o;
}

class HostBlockPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kernels::CreateBackend(kernels::BackendKind::kCpu, {}, &backend_).ok());
  }
  std::unique_ptr<kernels::KernelBackend> backend_;
};

TEST_F(HostBlockPoolTest, AllocatesDistinctBlocksAndFreesThem) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(8), backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 8, &a));
  EXPECT_EQ(std::set<BlockId>(a.begin(), a.end()).size(), 8u);
  EXPECT_EQ(pool->used_bytes(), pool->capacity_bytes());
  EXPECT_EQ(pool->used_blocks(StorageFormat::kF16), 8);
  pool->Free(StorageFormat::kF16, a);
  EXPECT_EQ(pool->used_bytes(), 0);
}

TEST_F(HostBlockPoolTest, AllocateIsAllOrNothingWhenFull) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(5), backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 3, &a));
  std::vector<BlockId> b;
  EXPECT_THAT(pool->Allocate(StorageFormat::kF16, 3, &b),
              StatusIs(absl::StatusCode::kResourceExhausted, "pool 'p' is full"));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool->used_blocks(StorageFormat::kF16), 3);
  KVC_EXPECT_OK(pool->Allocate(StorageFormat::kF16, 2, &b));
}

TEST_F(HostBlockPoolTest, FormatsShareOneByteCapacity) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4), backend_.get()));
  std::vector<BlockId> raw, int4;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 3, &raw));
  // One f16 block of bytes is left: it holds several smaller INT4 blocks.
  const int64_t fit = BlockBytes(StorageFormat::kF16) / BlockBytes(StorageFormat::kInt4G32);
  ASSERT_GE(fit, 2);
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kInt4G32, fit, &int4));
  std::vector<BlockId> more;
  EXPECT_THAT(pool->Allocate(StorageFormat::kInt4G32, 1, &more),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // Freeing raw blocks makes room for the other format at once.
  pool->Free(StorageFormat::kF16, raw);
  KVC_EXPECT_OK(pool->Allocate(StorageFormat::kInt4G32, 1, &more));
  EXPECT_EQ(pool->used_blocks(StorageFormat::kInt4G32), fit + 1);
}

TEST_F(HostBlockPoolTest, ReusesMostRecentlyFreedBlockFirst) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4), backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 2, &a));
  pool->Free(StorageFormat::kF16, {a[0]});
  std::vector<BlockId> b;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 1, &b));
  EXPECT_EQ(b[0], a[0]);
}

TEST_F(HostBlockPoolTest, RejectsInvalidGeometryAndFormats) {
  PoolOptions o = SmallPool(4);
  o.geometry.head_dim = 20;
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "head_dim"));
  o = SmallPool(4);
  o.geometry.num_query_heads = 3;
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_query_heads"));
  o = SmallPool(4);
  o.capacity_bytes = 10;
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "capacity_bytes"));
  o = SmallPool(4);
  o.device = "cuda:0";  // a device pool's (DeviceBlockPool)
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not host memory"));
  for (const char* device : {"gpu", "cuda", "cuda:", "cuda:x", "cuda:-1", "cuda:1234", "CPU"}) {
    o.device = device;
    EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
                StatusIs(absl::StatusCode::kInvalidArgument, "is not 'cpu' or 'cuda:N'"))
        << device;
  }
  o = SmallPool(4);
  o.geometry.head_dim = 48;  // INT4 g32 groups cannot tile 48
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  std::vector<BlockId> a;
  EXPECT_THAT(pool->Allocate(StorageFormat::kInt4G32, 1, &a),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot store head_dim 48"));
}

// Fills `blocks` of `format` with a byte derived from `tag` (every byte of each block).
void Fill(HostBlockPool& pool, StorageFormat format, const std::vector<BlockId>& blocks,
          uint8_t tag) {
  const kernels::PagedArena arena = pool.arena(format);
  const size_t bytes = arena.layout.block_bytes;
  for (BlockId id : blocks)
    std::memset(static_cast<uint8_t*>(arena.base) + static_cast<size_t>(id) * bytes, tag, bytes);
}

// True when every byte of `blocks` is still `tag`.
bool Holds(HostBlockPool& pool, StorageFormat format, const std::vector<BlockId>& blocks,
           uint8_t tag) {
  const kernels::PagedArena arena = pool.arena(format);
  const size_t bytes = arena.layout.block_bytes;
  for (BlockId id : blocks) {
    const uint8_t* p = static_cast<const uint8_t*>(arena.base) + static_cast<size_t>(id) * bytes;
    for (size_t i = 0; i < bytes; ++i) {
      if (p[i] != tag) return false;
    }
  }
  return true;
}

TEST_F(HostBlockPoolTest, FreeBlocksPastKeepFreeBytesGiveTheirPagesBack) {
  constexpr int64_t kBlocks = 4096;
  PoolOptions o = SmallPool(kBlocks);
  const int64_t block = BlockBytes(StorageFormat::kF16);
  o.keep_free_bytes = 256 * block;
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  std::vector<BlockId> all;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, kBlocks, &all));
  Fill(*pool, StorageFormat::kF16, all, 7);
  const int64_t written = kBlocks * block;
  ASSERT_GE(pool->ResidentBytes(), written) << "the arena is a memfd: its pages are counted";
  EXPECT_EQ(pool->free_resident_bytes(), 0);

  // Freeing a few blocks stays under the watermark: nothing goes.
  std::vector<BlockId> few(all.end() - 100, all.end());
  all.resize(all.size() - 100);
  pool->Free(StorageFormat::kF16, few);
  EXPECT_EQ(pool->TrimFreePages(), 0);
  EXPECT_EQ(pool->free_resident_bytes(), 100 * block);

  // Freeing the rest goes past it: the pages of all but half the watermark go back (the
  // trimmer thread may have done part of it already).
  pool->Free(StorageFormat::kF16, all);
  pool->TrimFreePages();
  EXPECT_LE(pool->free_resident_bytes(), *o.keep_free_bytes / 2);
  EXPECT_GT(pool->free_resident_bytes(), *o.keep_free_bytes / 2 - block);
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  EXPECT_GE(pool->released_bytes_total(), written - *o.keep_free_bytes / 2 - 2 * page);
  EXPECT_LE(pool->ResidentBytes(), *o.keep_free_bytes / 2 + 2 * page);

  // All of it can be used again: warm blocks first (the last ones freed, still holding their
  // bytes), then released ones, which read as zeros and take writes.
  std::vector<BlockId> again;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, kBlocks, &again));
  EXPECT_EQ(std::set<BlockId>(again.begin(), again.end()).size(), static_cast<size_t>(kBlocks));
  const std::vector<BlockId> first(again.begin(), again.begin() + 8);
  EXPECT_TRUE(Holds(*pool, StorageFormat::kF16, first, 7)) << "warm blocks are reused first";
  const std::vector<BlockId> last(again.end() - 8, again.end());
  EXPECT_TRUE(Holds(*pool, StorageFormat::kF16, last, 0)) << "released pages read as zeros";
  Fill(*pool, StorageFormat::kF16, again, 9);
  EXPECT_TRUE(Holds(*pool, StorageFormat::kF16, again, 9));
  EXPECT_GE(pool->ResidentBytes(), written);
}

TEST_F(HostBlockPoolTest, KeepingEveryPageReleasesNothing) {
  PoolOptions o = SmallPool(1024);
  o.keep_free_bytes = o.capacity_bytes;
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  std::vector<BlockId> all;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 1024, &all));
  Fill(*pool, StorageFormat::kF16, all, 3);
  pool->Free(StorageFormat::kF16, all);
  EXPECT_EQ(pool->TrimFreePages(), 0);
  EXPECT_EQ(pool->free_resident_bytes(), o.capacity_bytes);
  EXPECT_GE(pool->ResidentBytes(), o.capacity_bytes);
}

// The segment of `block` (one of `owner`'s) as a same-node reader of `owner` maps it, at the
// segment's place in a reservation of the whole arena; null when ShareSegment refuses.
class ReaderView {
 public:
  ReaderView() = default;
  ReaderView(const ReaderView&) = delete;
  ReaderView& operator=(const ReaderView&) = delete;
  // Call through ASSERT_NO_FATAL_FAILURE.
  void Map(HostBlockPool& pool, StorageFormat format, const std::string& owner, BlockId block) {
    format_ = format;
    KVC_ASSERT_OK_AND_ASSIGN(const SharedArena shape, pool.ShareArena(format, owner));
    segment_bytes_ = shape.segment_bytes;
    const std::vector<SegmentRef> refs = pool.SegmentsOf(format, {block});
    ASSERT_EQ(refs.size(), 1u);
    ref_ = refs[0];
    KVC_ASSERT_OK_AND_ASSIGN(UniqueFd fd, pool.ShareSegment(format, owner, ref_.index, ref_.epoch));
    void* p =
        ::mmap(nullptr, static_cast<size_t>(segment_bytes_), PROT_READ, MAP_SHARED, fd.get(), 0);
    ASSERT_NE(p, MAP_FAILED);
    base_ = static_cast<const uint8_t*>(p);
    first_ = ref_.index * segment_bytes_;
  }
  ~ReaderView() {
    if (base_ != nullptr)
      ::munmap(const_cast<uint8_t*>(base_), static_cast<size_t>(segment_bytes_));
  }
  // Every byte of `block` (in this segment) is `tag`.
  bool Holds(BlockId block, uint8_t tag) const {
    const int64_t bytes = BlockBytes(format_);
    const int64_t at = int64_t{block} * bytes - first_;
    if (at < 0 || at + bytes > segment_bytes_) return false;
    for (int64_t i = 0; i < bytes; ++i) {
      if (base_[at + i] != tag) return false;
    }
    return true;
  }
  const SegmentRef& ref() const { return ref_; }

 private:
  StorageFormat format_ = StorageFormat::kF16;
  int64_t segment_bytes_ = 0;
  int64_t first_ = 0;
  SegmentRef ref_;
  const uint8_t* base_ = nullptr;
};

// Tenant isolation by layout: blocks of different owners never share a segment, and a
// segment is handed to a reader of its owner only.
TEST_F(HostBlockPoolTest, OwnersNeverShareASegment) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4096), backend_.get()));
  const int64_t per_segment =
      pool->segment_bytes(StorageFormat::kF16) / BlockBytes(StorageFormat::kF16);
  ASSERT_GT(per_segment, 1);
  std::map<int64_t, std::string> owner_of;  // segment -> owner
  std::map<std::string, std::vector<BlockId>> held;
  for (int round = 0; round < 40; ++round) {
    for (const std::string owner : {"a", "b", "c"}) {
      std::vector<BlockId> got;
      KVC_ASSERT_OK(pool->AllocateFor(StorageFormat::kF16, 1 + round % 7, owner, &got));
      for (BlockId b : got) {
        auto [it, added] = owner_of.emplace(b / per_segment, owner);
        EXPECT_EQ(it->second, owner) << "block " << b << " shares segment " << b / per_segment;
        held[owner].push_back(b);
      }
      if (round % 3 == 2) {  // free some, so that owners reuse their own holes
        pool->Free(StorageFormat::kF16, {held[owner].front()});
        held[owner].erase(held[owner].begin());
      }
    }
  }
  const BlockId a = held["a"].back();
  Fill(*pool, StorageFormat::kF16, {a}, 0x5a);
  ReaderView mine;
  ASSERT_NO_FATAL_FAILURE(mine.Map(*pool, StorageFormat::kF16, "a", a));
  EXPECT_TRUE(mine.Holds(a, 0x5a)) << "the reader sees the owner's bytes in place";
  for (const std::string other : {"b", "", "A"}) {
    EXPECT_THAT(pool->ShareSegment(StorageFormat::kF16, other, mine.ref().index, mine.ref().epoch),
                StatusIs(absl::StatusCode::kFailedPrecondition, "holds none of this tenant's"))
        << other;
  }
  EXPECT_THAT(
      pool->ShareSegment(StorageFormat::kF16, "a", mine.ref().index, mine.ref().epoch + 1000),
      StatusIs(absl::StatusCode::kFailedPrecondition));
}

// A segment passes to another owner only as new memory: the previous owner's reader keeps a
// mapping of the old memfd, which reads zeros, and cannot map the new one; the new owner
// sees only its own bytes. With every segment held, another owner's allocation is refused
// until one is free.
TEST_F(HostBlockPoolTest, ASegmentChangesOwnerOnlyAsNewZeroedMemory) {
  PoolOptions o = SmallPool(256);
  o.keep_free_bytes = o.capacity_bytes;  // the trimmer keeps out of it: only a claim steals
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  // One block per owner until every segment of the arena is held.
  std::vector<std::pair<std::string, BlockId>> owners;
  for (int i = 0;; ++i) {
    std::vector<BlockId> got;
    const std::string owner = absl::StrCat("t", i);
    const absl::Status s = pool->AllocateFor(StorageFormat::kF16, 1, owner, &got);
    if (!s.ok()) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "holds other tenants' blocks"));
      break;
    }
    owners.emplace_back(owner, got[0]);
    ASSERT_LT(i, 100000);
  }
  ASSERT_GT(owners.size(), 2u);
  EXPECT_LT(pool->used_bytes(), pool->capacity_bytes()) << "bytes were free all along";
  const auto [first, block] = owners[0];
  Fill(*pool, StorageFormat::kF16, {block}, 0x77);
  ReaderView old_view;
  ASSERT_NO_FATAL_FAILURE(old_view.Map(*pool, StorageFormat::kF16, first, block));
  ASSERT_TRUE(old_view.Holds(block, 0x77));

  pool->Free(StorageFormat::kF16, {block});
  std::vector<BlockId> stolen;
  KVC_ASSERT_OK(pool->AllocateFor(StorageFormat::kF16, 1, "newcomer", &stolen));
  EXPECT_EQ(
      stolen[0] / (pool->segment_bytes(StorageFormat::kF16) / BlockBytes(StorageFormat::kF16)),
      old_view.ref().index)
      << "the only free segment";
  EXPECT_TRUE(Holds(*pool, StorageFormat::kF16, stolen, 0)) << "new memory reads as zeros";
  Fill(*pool, StorageFormat::kF16, stolen, 0x33);
  EXPECT_TRUE(old_view.Holds(block, 0)) << "the old owner's mapping was emptied";
  EXPECT_FALSE(old_view.Holds(stolen[0], 0x33)) << "and never shows the new owner's bytes";
  EXPECT_THAT(
      pool->ShareSegment(StorageFormat::kF16, first, old_view.ref().index, old_view.ref().epoch),
      StatusIs(absl::StatusCode::kFailedPrecondition));
  ReaderView new_view;
  ASSERT_NO_FATAL_FAILURE(new_view.Map(*pool, StorageFormat::kF16, "newcomer", stolen[0]));
  EXPECT_GT(new_view.ref().epoch, old_view.ref().epoch);
  EXPECT_TRUE(new_view.Holds(stolen[0], 0x33));
}

// What a same-node reader receives cannot write the pool: a read-only descriptor of a memfd
// whose mode is 0400. As another uid (root only), reopening it for writing and changing its
// mode are refused too.
TEST_F(HostBlockPoolTest, ReadersGetADescriptorTheyCannotWriteThrough) {
  PoolOptions o = SmallPool(1024);
  o.keep_free_bytes = 0;
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->AllocateFor(StorageFormat::kF16, 1, "t", &a));
  const std::vector<SegmentRef> refs = pool->SegmentsOf(StorageFormat::kF16, a);
  ASSERT_EQ(refs.size(), 1u);
  KVC_ASSERT_OK_AND_ASSIGN(const UniqueFd shared, pool->ShareSegment(StorageFormat::kF16, "t",
                                                                     refs[0].index, refs[0].epoch));
  EXPECT_EQ(::fcntl(shared.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
  struct stat st {};
  ASSERT_EQ(::fstat(shared.get(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u);
  EXPECT_EQ(st.st_size, pool->segment_bytes(StorageFormat::kF16));
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, shared.get(), 0), MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  EXPECT_NE(::ftruncate(shared.get(), 0), 0) << "a reader cannot shrink it under kvcached";
  void* view = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, shared.get(), 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_NE(::mprotect(view, 4096, PROT_READ | PROT_WRITE), 0);
  ::munmap(view, 4096);
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  const int fd = shared.get();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls after fork: the exit code says what failed.
    constexpr uid_t kNobody = 65534;
    if (::setresgid(kNobody, kNobody, kNobody) != 0 || ::setresuid(kNobody, kNobody, kNobody) != 0)
      ::_exit(10);
    char path[64] = "/proc/self/fd/";
    size_t n = std::strlen(path);
    char digits[16];
    size_t d = 0;
    for (int v = fd; v > 0 || d == 0; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
    while (d > 0) path[n++] = digits[--d];
    path[n] = '\0';
    if (::open(path, O_RDWR) >= 0 || errno != EACCES) ::_exit(11);
    if (::fchmod(fd, 0600) == 0 || errno != EPERM) ::_exit(12);
    // What it was given still maps for reading.
    if (::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) ::_exit(13);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10 setresuid, 11 reopened for writing, 12 chmod, 13 no read mapping";
}

// Allocations, writes and frees from several threads while the trimmer releases pages behind
// them: a block in use never loses a byte (a page released under it would read zeros).
TEST_F(HostBlockPoolTest, TheTrimmerNeverReleasesABlockInUse) {
  PoolOptions o = SmallPool(2048);
  o.keep_free_bytes = 0;
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  std::atomic<int> lost{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> workers;
  workers.reserve(3);
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&, t] {
      for (int round = 0; round < 300; ++round) {
        std::vector<BlockId> mine;
        const int64_t n = 16 + (round * 7 + t * 13) % 200;
        if (!pool->Allocate(StorageFormat::kF16, n, &mine).ok()) continue;
        const auto tag = static_cast<uint8_t>(1 + (t * 31 + round) % 250);
        Fill(*pool, StorageFormat::kF16, mine, tag);
        std::this_thread::yield();
        if (!Holds(*pool, StorageFormat::kF16, mine, tag)) ++lost;
        pool->Free(StorageFormat::kF16, mine);
      }
    });
  }
  std::thread trimmer([&] {
    while (!done.load()) pool->TrimFreePages();
  });
  for (std::thread& w : workers) w.join();
  done = true;
  trimmer.join();
  EXPECT_EQ(lost.load(), 0);
  EXPECT_GT(pool->released_bytes_total(), 0);
  EXPECT_EQ(pool->used_bytes(), 0);
}

TEST_F(HostBlockPoolTest, DoubleFreeAborts) {
  PoolOptions o = SmallPool(4);
  o.keep_free_bytes = o.capacity_bytes;  // no trimmer thread: the death test forks
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 1, &a));
  pool->Free(StorageFormat::kF16, a);
  EXPECT_DEATH(pool->Free(StorageFormat::kF16, a), "double free");
}

}  // namespace
}  // namespace kvc::cachesvc
