// Stop signals taken by one sigwait() thread (qkv/signals.h): no handler ever runs on a thread
// that computes, because oneDNN's AVX-512 GEMM kernels keep their stack pointer in heap memory.
#include "qkv/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "qkv/error.h"

namespace qkv {
namespace {

std::atomic<std::atomic<bool>*> g_target{nullptr};
// Where signals go once a stop request that was triggered has ended: the program is winding down
// (saving a checkpoint, exiting), and a second Ctrl-C must not kill it half-way.
std::atomic<bool> g_absorbed{false};
std::once_flag g_started;
std::atomic<bool> g_running{false};

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  return s;
}

[[noreturn]] void take_signals() {
  const sigset_t set = stop_set();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (std::atomic<bool>* t = g_target.load()) {
      t->store(true);
      continue;
    }
    // No stop request: what the default action would have done. Unblocked in this thread only,
    // the re-raised signal ends the process with the signal's status.
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
    ::_exit(128 + sig);  // not reached
  }
}

}  // namespace

void block_stop_signals() {
  std::call_once(g_started, [] {
    const sigset_t set = stop_set();
    const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr);
    check(rc == 0, "block_stop_signals: pthread_sigmask failed: ", std::strerror(rc));
    std::thread(take_signals).detach();
    g_running = true;
  });
}

StopRequest::StopRequest() {
  check(g_running.load(), "StopRequest: call qkv::block_stop_signals() first (at the start of main)");
  std::atomic<bool>* expected = g_target.load();
  check((expected == nullptr || expected == &g_absorbed) && g_target.compare_exchange_strong(expected, &flag_),
        "StopRequest: only one may exist at a time");
}

StopRequest::~StopRequest() { g_target.store(flag_.load() ? &g_absorbed : nullptr); }

}  // namespace qkv
