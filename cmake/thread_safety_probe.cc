// Configure-time probe for the clang-tsa preset (cmake/KvcThreadSafety.cmake): the correct
// uses below must compile cleanly under -Werror=thread-safety, and each KVC_TSA_PROBE_*
// misuse must be rejected. If a change to common/mutex.h dropped an annotation, the analysis
// would silently stop checking kvc::Mutex users; this probe turns that into a configure error.
#include "common/mutex.h"

namespace {

class Counter {
 public:
  void Add(int n) ABSL_LOCKS_EXCLUDED(mu_) {
    kvc::MutexLock lock(&mu_);
    AddLocked(n);
  }
  int Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    kvc::ReaderMutexLock lock(&mu_);
    return value_;
  }
  bool TryAdd(int n) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!mu_.TryLock()) return false;
    value_ += n;
    mu_.Unlock();
    return true;
  }
  int GetManually() const ABSL_LOCKS_EXCLUDED(mu_) {
    mu_.ReaderLock();
    const int v = value_;
    mu_.ReaderUnlock();
    return v;
  }
  void AddAsserted(int n) {
    mu_.AssertHeld();
    value_ += n;
  }

#if defined(KVC_TSA_PROBE_UNLOCKED_WRITE)
  void Misuse() { value_ = 1; }
#elif defined(KVC_TSA_PROBE_UNLOCKED_READ)
  int Misuse() { return value_; }
#elif defined(KVC_TSA_PROBE_WRITE_UNDER_READER_LOCK)
  void Misuse() {
    kvc::ReaderMutexLock lock(&mu_);
    value_ = 1;
  }
#elif defined(KVC_TSA_PROBE_REQUIRES_NOT_HELD)
  void Misuse() { AddLocked(1); }
#elif defined(KVC_TSA_PROBE_LOCK_NOT_RELEASED)
  void Misuse() { mu_.Lock(); }
#endif

 private:
  void AddLocked(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { value_ += n; }

  mutable kvc::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

int KvcThreadSafetyProbe() {
  Counter c;
  c.Add(1);
  (void)c.TryAdd(1);
  return c.Get() + c.GetManually();
}
