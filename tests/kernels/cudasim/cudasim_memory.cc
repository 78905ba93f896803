// cudasim's simulated memory: device and pinned mappings, their protection, SIGSEGV diagnosis.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cudasim_internal.h"

namespace kvc_sim::internal {

// Memory. Each device allocation is its own mapping: its pages, PROT_NONE except while
// device work executes, between two guard pages that are never opened, with the allocation
// placed at the end of its pages (256-byte aligned, as cudaMalloc's) so that a kernel that
// runs past it faults; under AddressSanitizer the slack around it is poisoned too, so that
// any byte outside it is reported. Pinned host memory is registered (for
// cudaPointerGetAttributes and the copy rules) and always accessible.

namespace {

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}
size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

void Protect(uintptr_t base, size_t bytes, int prot) {
  if (bytes == 0) return;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  if (mprotect(reinterpret_cast<void*>(base), bytes, prot) != 0) {
    std::fprintf(stderr, "cudasim: mprotect failed (errno %d)\n", errno);
    std::abort();
  }
}

// The region holding `a` among [p, p + bytes) ranges (nullptr if none); m.mu held.
const Region* FindLocked(Memory& m, uintptr_t a, uintptr_t* key) {
  auto it = m.regions.upper_bound(a);
  if (it == m.regions.begin()) return nullptr;
  --it;
  if (a - it->first >= it->second.bytes) return nullptr;
  *key = it->first;
  return &it->second;
}

// SIGSEGV with a diagnosis, for faults at device allocations: host code touching device
// memory outside device work, or device work past an allocation's end. Installed only where
// nothing else handles SIGSEGV (AddressSanitizer reports those faults itself).
void OnSegv(int, siginfo_t* info, void*) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  Memory& m = Mem();
  char msg[300];
  int n = 0;
  if (m.mu.try_lock()) {
    for (const auto& [key, r] : m.regions) {
      if (!r.device || a < r.map_base || a - r.map_base >= r.mapped) continue;
      if (a - key < r.bytes && !t_executing) {
        n = std::snprintf(msg, sizeof msg,
                          "cudasim: host code accessed device memory at %p (byte %zu of a "
                          "%zu-byte device allocation) outside device work\n",
                          info->si_addr, static_cast<size_t>(a - key), r.bytes);
      } else {
        n = std::snprintf(
            msg, sizeof msg,
            "cudasim: %s accessed %p, outside the %zu-byte device allocation at "
            "%p (a guard page)\n",
            t_executing ? "device work" : "host code", info->si_addr, r.bytes,
            // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
            reinterpret_cast<void*>(key));
      }
      break;
    }
    m.mu.unlock();
  }
  if (n > 0) (void)!write(2, msg, static_cast<size_t>(n) < sizeof msg ? n : sizeof msg - 1);
  signal(SIGSEGV, SIG_DFL);  // the faulting access runs again and kills the process
}
void InstallSegvHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGSEGV, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
  });
}

}  // namespace

Memory& Mem() {
  static Memory m;
  return m;
}

void SetDeviceAccess(bool open) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  for (const auto& [base, r] : m.regions)
    if (r.device) Protect(r.pages, r.opened, open ? PROT_READ | PROT_WRITE : PROT_NONE);
  m.open = open;
}

namespace {

// Reserves `mapped` bytes of address space (PROT_NONE) and, with memfd >= 0, maps the file's
// first `opened` bytes one page in (between the guard pages); 0 on failure.
uintptr_t MapDevicePages(size_t mapped, size_t opened, int memfd, bool open) {
  void* base = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return 0;
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  const uintptr_t pages = b + PageBytes();
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  if (memfd >= 0 && mmap(reinterpret_cast<void*>(pages), opened, PROT_NONE, MAP_SHARED | MAP_FIXED,
                         memfd, 0) == MAP_FAILED) {
    munmap(base, mapped);
    return 0;
  }
  // A region mapped while another thread's device work runs must be usable by it at once.
  if (open) Protect(pages, opened, PROT_READ | PROT_WRITE);
  return b;
}

// What cudaIpcGetMemHandle's 64 bytes carry here: enough to find and check the exporter's
// memfd from another process.
struct SimIpcHandle {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t inode;
  uint64_t opened;       // the file's bytes (whole pages)
  uint64_t bytes;        // the allocation's
  uint64_t user_offset;  // of the allocation's start into its pages
  char unused[16];
};
static_assert(sizeof(SimIpcHandle) == sizeof(cudaIpcMemHandle_t));
constexpr char kIpcMagic[8] = {'c', 'u', 'd', 'a', 's', 'i', 'm', '1'};

}  // namespace

cudaError_t MapRegion(void** p, size_t bytes, bool device) {
  *p = nullptr;
  if (device) InstallSegvHandler();
  Memory& m = Mem();
  const size_t page = PageBytes();
  if (bytes == 0) bytes = 1;
  const size_t opened = RoundUp(bytes, page);
  const size_t mapped = opened + (device ? 2 * page : 0);
  std::lock_guard<std::mutex> lock(m.mu);
  if (device && opened > m.capacity - m.used) return cudaErrorMemoryAllocation;
  int memfd = -1;
  uintptr_t b = 0;
  if (device) {
    // Large allocations (pools) can be exported: their pages live in a memfd that another
    // process may map. Small ones stay anonymous (no fd per scratch buffer).
    if (bytes >= kIpcMinBytes) {
      memfd = memfd_create("cudasim-device", MFD_CLOEXEC);
      if (memfd < 0 || ftruncate(memfd, static_cast<off_t>(opened)) != 0) {
        if (memfd >= 0) close(memfd);
        return cudaErrorMemoryAllocation;
      }
    }
    b = MapDevicePages(mapped, opened, memfd, m.open);
    if (b == 0 && memfd >= 0) close(memfd);
  } else {
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    b = base == MAP_FAILED ? 0 : reinterpret_cast<uintptr_t>(base);
  }
  if (b == 0) return cudaErrorMemoryAllocation;
  const uintptr_t pages = device ? b + page : b;
  const uintptr_t user = device ? pages + opened - RoundUp(bytes, 256) : b;
  KVC_SIM_POISON(pages, user - pages);
  KVC_SIM_POISON(user + bytes, pages + opened - (user + bytes));
  m.regions[user] = Region{bytes, b, mapped, pages, opened, device, memfd, false};
  if (device) m.used += opened;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  *p = reinterpret_cast<void*>(user);  // NOLINT(performance-no-int-to-ptr): the sim's own mappings
  return cudaSuccess;
}

cudaError_t UnmapRegion(void* p, bool device, bool imported) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  const auto it = m.regions.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.regions.end() || it->second.device != device || it->second.imported != imported) {
    return imported ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue;
  }
  const Region& r = it->second;
  KVC_SIM_UNPOISON(r.pages, r.opened);  // the next mapping here starts clean
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  munmap(reinterpret_cast<void*>(r.map_base), r.mapped);
  if (r.memfd >= 0) close(r.memfd);
  if (device && !r.imported) m.used -= r.opened;
  m.regions.erase(it);
  return cudaSuccess;
}

cudaError_t IpcExport(void* p, cudaIpcMemHandle_t* handle) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  const auto it = m.regions.find(reinterpret_cast<uintptr_t>(p));
  // CUDA exports the allocation a pointer lies in; the sim only its start (all callers here).
  if (it == m.regions.end() || !it->second.device || it->second.imported) {
    return cudaErrorInvalidValue;
  }
  const Region& r = it->second;
  struct stat st {};
  if (r.memfd < 0 || fstat(r.memfd, &st) != 0) {
    std::fprintf(stderr, "cudasim: only allocations of >= %zu bytes can be exported\n",
                 kIpcMinBytes);
    return cudaErrorInvalidValue;
  }
  SimIpcHandle h{};
  std::memcpy(h.magic, kIpcMagic, sizeof(kIpcMagic));
  h.pid = static_cast<int32_t>(getpid());
  h.fd = r.memfd;
  h.inode = static_cast<uint64_t>(st.st_ino);
  h.opened = r.opened;
  h.bytes = r.bytes;
  h.user_offset = it->first - r.pages;
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t IpcOpen(const cudaIpcMemHandle_t& handle, void** p) {
  *p = nullptr;
  SimIpcHandle h{};
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kIpcMagic, sizeof(kIpcMagic)) != 0 || h.bytes == 0 ||
      h.user_offset + h.bytes > h.opened || h.opened % PageBytes() != 0) {
    return cudaErrorInvalidResourceHandle;
  }
  if (h.pid == static_cast<int32_t>(getpid())) return cudaErrorDeviceUninitialized;
  InstallSegvHandler();
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat st {};
  // The inode tells a freed allocation (or an exited process) from the one exported.
  if (fd < 0 || fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != h.inode ||
      static_cast<uint64_t>(st.st_size) != h.opened) {
    if (fd >= 0) close(fd);
    return cudaErrorInvalidResourceHandle;
  }
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  const size_t mapped = h.opened + 2 * PageBytes();
  const uintptr_t b = MapDevicePages(mapped, h.opened, fd, m.open);
  if (b == 0) {
    close(fd);
    return cudaErrorMemoryAllocation;
  }
  const uintptr_t pages = b + PageBytes();
  const uintptr_t user = pages + h.user_offset;
  KVC_SIM_POISON(pages, user - pages);
  KVC_SIM_POISON(user + h.bytes, pages + h.opened - (user + h.bytes));
  m.regions[user] = Region{h.bytes, b, mapped, pages, h.opened, true, fd, true};
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  *p = reinterpret_cast<void*>(user);
  return cudaSuccess;
}

bool Classify(const void* p, size_t bytes, Kind* kind) {
  Memory& m = Mem();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(m.mu);
  uintptr_t key = 0;
  const Region* r = FindLocked(m, a, &key);
  if (r == nullptr) return *kind = Kind::kPageable, true;
  *kind = r->device ? Kind::kDevice : Kind::kPinned;
  return a - key + bytes <= r->bytes;
}

}  // namespace kvc_sim::internal
