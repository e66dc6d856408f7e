// qkv/signals.h: SIGINT and SIGTERM in a program that computes with qkv, without signal handlers.
//
// Why no handlers: oneDNN's AVX-512 single-precision GEMM kernels (Debian 12's libdnnl 2.6, and
// later versions: oneDNN issue #4845) point the stack pointer into heap memory while they run. A
// signal handler that runs on such a thread has its frame written there by the kernel, which
// corrupts the heap ("corrupted size vs. prev_size", or a crash later in a backward pass). Any
// program calling qkv::sgemm, and so every model, must therefore never run a signal handler on a
// thread that computes. qkv's own tool takes the stop signals this way:
//
//   int main() {
//     qkv::block_stop_signals();   // first, before any thread exists: threads inherit the mask
//     ...
//     qkv::StopRequest stop;       // while it lives, SIGINT / SIGTERM set stop.flag()
//     run_training(..., loop_config_with(.stop = &stop.flag()), ...);
//   }
//
// The signals are blocked in every thread; one thread waits for them with sigwait() and, while a
// StopRequest exists, sets its flag; otherwise it ends the process as the signal's default
// action would (so the exit status still says "killed by SIGINT"). A signal the process was
// started with ignored (a background job of a shell) stays ignored.
#pragma once
#include <atomic>

namespace qkv {

// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it creates later) and
// starts the one thread that takes them. Idempotent; throws qkv::Error if it cannot.
void block_stop_signals();

// While alive, SIGINT / SIGTERM set flag() (once or many times) instead of ending the process.
// One at a time. block_stop_signals() must have been called. Once a request that was triggered
// ends, later stop signals are absorbed: the program is winding down (qkv train has saved its
// checkpoint and is exiting with 130), and a second Ctrl-C must not kill it half-way.
// A new StopRequest takes them again.
class StopRequest {
 public:
  StopRequest();
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;
  const std::atomic<bool>& flag() const { return flag_; }
  bool requested() const { return flag_.load(); }

 private:
  std::atomic<bool> flag_{false};
};

}  // namespace qkv
