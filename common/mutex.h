// kvc::Mutex: absl::Mutex plus ThreadSanitizer annotations.
//
// Debian's libabsl is not built with TSan, so TSan cannot see the happens-before edges of
// absl::Mutex and would report every guarded access as a race. Announcing acquire/release
// on the mutex's address makes the tsan preset meaningful; outside TSan builds the
// annotations compile to nothing.
//
// Clang's thread-safety analysis (the clang-tsa preset) sees through these classes exactly
// as through absl::Mutex: Mutex is a capability (ABSL_LOCKABLE), the scoped locks are
// ABSL_SCOPED_LOCKABLE, and every acquire/release carries its annotation, so
// ABSL_GUARDED_BY(mu_) fields and ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) functions are checked.
// cmake/KvcThreadSafety.cmake compiles cmake/thread_safety_probe.cc at configure time to prove
// that misuse is still rejected.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define KVC_TSAN_ACQUIRE(addr) __tsan_acquire(addr)
#define KVC_TSAN_RELEASE(addr) __tsan_release(addr)
#else
#define KVC_TSAN_ACQUIRE(addr) (void)(addr)
#define KVC_TSAN_RELEASE(addr) (void)(addr)
#endif

namespace kvc {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  ~Mutex() = default;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    KVC_TSAN_ACQUIRE(this);
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    KVC_TSAN_RELEASE(this);
    mu_.Unlock();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() {
    mu_.ReaderLock();
    KVC_TSAN_ACQUIRE(this);
  }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() {
    KVC_TSAN_RELEASE(this);
    mu_.ReaderUnlock();
  }
  // Returns true, holding the lock, when it was free.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    if (!mu_.TryLock()) return false;
    KVC_TSAN_ACQUIRE(this);
    return true;
  }

  // Releases the lock (held exclusively or shared) until `cond` holds, then holds it again
  // the same way. `cond` is evaluated with the lock held, by any thread: absl runs a waiter's
  // condition inside the Unlock of whichever thread releases the lock, after that thread's
  // release annotation, so each condition calls ConditionRead() after its reads (below).
  void Await(const absl::Condition& cond) ABSL_SHARED_LOCKS_REQUIRED(this) {
    KVC_TSAN_RELEASE(this);
    mu_.Await(cond);
    KVC_TSAN_ACQUIRE(this);
  }

  // For ThreadSanitizer: publishes what an Await condition just read (the guarded state and
  // the condition object, which lives on the waiter's stack) as read under this lock, so the
  // next holder's writes (and the waiter's reuse of its stack) are ordered after those reads.
  // Without it TSan reports those reads as racing (they happen after the releasing thread's
  // annotation, inside absl::Mutex::Unlock). No effect outside TSan builds.
  void ConditionRead() const { KVC_TSAN_RELEASE(const_cast<Mutex*>(this)); }

  // Require that this thread holds the lock (exclusively / at least shared); absl aborts
  // when it can tell it does not. They also tell the analysis that the lock is held where it
  // cannot see the acquisition (callbacks, lambdas).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() { mu_.AssertReaderHeld(); }

 private:
  absl::Mutex mu_;
};

// Scoped exclusive lock.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

 private:
  Mutex* const mu_;
};

// Scoped shared lock.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }

 private:
  Mutex* const mu_;
};

using WriterMutexLock = MutexLock;

}  // namespace kvc
