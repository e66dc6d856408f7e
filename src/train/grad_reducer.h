// Data parallelism's gradient buckets, summed over the ranks while the backward pass runs (as
// PyTorch DDP does). The parameters, in reverse order (the order backward finishes them), are cut
// into buckets of about bucket_bytes. Which backward closure finishes each gradient (the lowest
// tape index that writes it, Node::last_writer) is learned on one step and used on the next:
// after each closure, the next bucket in order whose gradients are all final is copied into its
// buffer and its sum started. Every rank starts the buckets in the same order, so the collectives
// match whatever the timing. After backward the remaining buckets start and every sum is awaited;
// a gradient written after its bucket left (a step whose closures differ from the learned ones)
// is caught, and then, on every rank, the whole gradient is summed again at once. The sums are
// those of one call (each element added in rank order), so bucketing changes no bit.
//
// A step with ranks: begin(); the tape calls after_op() after each closure of the last
// micro-batch's backward; finish() counts this rank's late gradients (the trainer sums the count
// over the ranks with the loss); land() writes the sums into the gradients, or sums every
// gradient again when any rank had a late one. Implemented in distributed.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "qkv/distributed.h"
#include "qkv/model.h"

namespace qkv {

class GradientReducer {
 public:
  GradientReducer(const std::vector<Parameter>& params, int64_t bucket_bytes);

  // A step begins; backward_runs: this rank has a micro-batch (else its gradients stay zero).
  void begin(std::vector<Parameter>& params, bool backward_runs);
  // After closure `index` of the last micro-batch's backward: start the buckets now final.
  void after_op(std::vector<Parameter>& params, Communicator& comm, size_t index);
  // Starts what is left, waits for every sum; returns the number of this rank's gradients written
  // after their bucket left (0: its sums are good). Learns this step's closures for the next.
  int64_t finish(std::vector<Parameter>& params, Communicator& comm, bool backward_ran);
  // The sums into the gradients; resum (some rank had a late gradient): every gradient summed
  // again over the ranks at once instead. Returns the seconds spent waiting on the ranks.
  double land(std::vector<Parameter>& params, Communicator& comm, bool resum);

  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // this step's buckets that left while the backward pass was still running
  int64_t buckets_early() const;

 private:
  void send(std::vector<Parameter>& params, Communicator& comm, size_t b);

  std::vector<std::vector<size_t>> buckets_;  // parameter indices
  std::vector<std::vector<float>> buffers_;
  std::vector<int64_t> final_at_;             // per parameter: learned tape index (INT64_MAX: before backward)
  std::vector<int64_t> bucket_final_at_;      // per bucket: the lowest of its parameters'
  std::vector<int64_t> sent_at_;              // per bucket, this step: the closure after which it left (-1: after backward)
  bool learned_ = false, scheduled_ = false;
  size_t next_ = 0;
};

}  // namespace qkv
