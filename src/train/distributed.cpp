// The parts of data parallelism that do not depend on the transport (qkv/distributed.h), and the
// gradient buckets the trainer sums over the ranks (train/grad_reducer.h).
#include "qkv/distributed.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <nlohmann/json.hpp>

#include "qkv/safetensors.h"
#include "qkv/tensor.h"
#include "train/grad_reducer.h"

namespace qkv {

void Communicator::broadcast_string(std::string& s, int root) {
  double n = static_cast<double>(s.size());
  if (rank() != root) n = 0;
  sum_doubles(&n, 1);  // only the root's length is non-zero
  s.resize(static_cast<size_t>(n));
  if (!s.empty()) broadcast(s.data(), static_cast<int64_t>(s.size()), root);
}

void Communicator::send_string(const std::string& s, int dest) {
  const uint64_t n = s.size();
  send(&n, sizeof n, dest);
  if (n > 0) send(s.data(), static_cast<int64_t>(n), dest);
}

std::string Communicator::recv_string(int source) {
  uint64_t n = 0;
  recv(&n, sizeof n, source);
  check(n <= (uint64_t{1} << 40), "train: internal: rank ", source, " sent a message of ", n, " bytes");
  std::string s(static_cast<size_t>(n), '\0');
  if (n > 0) recv(s.data(), static_cast<int64_t>(n), source);
  return s;
}

void on_lead(Communicator& comm, const std::function<void()>& work) {
  std::string failure;
  std::exception_ptr own;
  if (comm.rank() == 0) {
    try {
      work();
    } catch (const std::exception& e) {
      own = std::current_exception();
      failure = e.what();
      if (failure.empty()) failure = "failed";
    }
  }
  comm.broadcast_string(failure, 0);
  if (own) std::rethrow_exception(own);
  if (!failure.empty()) throw FailedOnLead(failure);
}

void broadcast_safetensors(Communicator& comm, SafetensorsFile& f, int root) {
  using json = nlohmann::json;
  std::string header;
  if (comm.rank() == root) {
    json j = {{"metadata", f.metadata}, {"tensors", json::array()}};
    for (const auto& [name, t] : f.tensors) j["tensors"].push_back({name, static_cast<int>(t.dtype()), t.shape()});
    header = j.dump();
  }
  comm.broadcast_string(header, root);
  if (comm.rank() != root) {
    SafetensorsFile g;
    try {
      const json j = json::parse(header);
      g.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
      for (const json& t : j.at("tensors")) {
        const int dt = t.at(1).get<int>();
        check(dt >= 0 && dt <= static_cast<int>(DType::BF16), "a dtype out of range");
        g.tensors.emplace_back(t.at(0).get<std::string>(),
                               Tensor::empty(t.at(2).get<std::vector<int64_t>>(), static_cast<DType>(dt)));
      }
    } catch (const std::exception& e) {
      throw Error(detail::concat("train: internal: a malformed checkpoint from rank ", root, ": ", e.what()));
    }
    f = std::move(g);
  }
  for (auto& [name, t] : f.tensors)
    if (t.nbytes() > 0) comm.broadcast(t.raw_data(), static_cast<int64_t>(t.nbytes()), root);
}

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

bool same_on_every_rank(Communicator& comm, uint64_t value) {
  uint64_t root = value;
  comm.broadcast(&root, sizeof root, 0);
  double differs = root != value ? 1.0 : 0.0;
  comm.sum_doubles(&differs, 1);
  return differs == 0.0;
}

// ---- GradientReducer (grad_reducer.h) ----------------------------------------------------------

GradientReducer::GradientReducer(const std::vector<Parameter>& params, int64_t bucket_bytes) {
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float)));
  int64_t in = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const int64_t n = params[i].var->value.numel();
    if (buckets_.empty() || (in > 0 && in + n > cap)) buckets_.emplace_back(), in = 0;
    buckets_.back().push_back(i);
    in += n;
  }
  buffers_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t n = 0;
    for (size_t i : buckets_[b]) n += params[i].var->value.numel();
    buffers_[b].resize(static_cast<size_t>(n));
  }
  final_at_.assign(params.size(), INT64_MAX);
  bucket_final_at_.assign(buckets_.size(), INT64_MAX);
}

void GradientReducer::begin(std::vector<Parameter>& params, bool backward_runs) {
  next_ = 0;
  sent_at_.assign(buckets_.size(), -1);
  scheduled_ = learned_ && backward_runs;
  for (Parameter& p : params) p.var->last_writer = -1;
}

void GradientReducer::after_op(std::vector<Parameter>& params, Communicator& comm, size_t index) {
  if (!scheduled_) return;
  const auto at = static_cast<int64_t>(index);
  while (next_ < buckets_.size() && bucket_final_at_[next_] >= at) {
    sent_at_[next_] = at;
    send(params, comm, next_++);
  }
  comm.progress();
}

void GradientReducer::send(std::vector<Parameter>& params, Communicator& comm, size_t b) {
  float* dst = buffers_[b].data();
  for (size_t i : buckets_[b]) {
    Node& v = *params[i].var;
    const int64_t n = v.value.numel();
    if (!v.has_grad) {
      bool add = false;
      float* g = v.grad_dest(&add);
      std::fill(g, g + n, 0.0f);  // no gradient reached it: zero
    }
    std::memcpy(dst, v.grad.data<float>(), sizeof(float) * static_cast<size_t>(n));
    dst += n;
  }
  comm.start_sum(buffers_[b].data(), static_cast<int64_t>(buffers_[b].size()));
}

int64_t GradientReducer::finish(std::vector<Parameter>& params, Communicator& comm, bool backward_ran) {
  while (next_ < buckets_.size()) send(params, comm, next_++);
  comm.wait_all();
  int64_t late = 0;
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t i : buckets_[b]) {
      const int64_t w = params[i].var->last_writer;
      if (sent_at_[b] >= 0 && w >= 0 && w < sent_at_[b]) ++late;
    }
  if (backward_ran) {
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t w = params[i].var->last_writer;
      final_at_[i] = w >= 0 ? w : INT64_MAX;
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      bucket_final_at_[b] = INT64_MAX;
      for (size_t i : buckets_[b]) bucket_final_at_[b] = std::min(bucket_final_at_[b], final_at_[i]);
    }
    learned_ = true;
  }
  return late;
}

int64_t GradientReducer::buckets_early() const {
  int64_t n = 0;
  for (int64_t at : sent_at_) n += at > 0 ? 1 : 0;  // (after closure 0: backward is over)
  return n;
}

double GradientReducer::land(std::vector<Parameter>& params, Communicator& comm, bool resum) {
  if (!resum) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const float* src = buffers_[b].data();
      for (size_t i : buckets_[b]) {
        const int64_t n = params[i].var->value.numel();
        std::memcpy(params[i].var->grad.data<float>(), src, sizeof(float) * static_cast<size_t>(n));
        src += n;
      }
    }
    return 0.0;
  }
  // some rank sent a gradient before backward had finished it: every rank sums them all again
  int64_t total = 0;
  for (const Parameter& p : params) total += p.var->value.numel();
  std::vector<float> flat(static_cast<size_t>(total));
  int64_t at = 0;
  for (const Parameter& p : params) {
    std::memcpy(flat.data() + at, p.var->grad.data<float>(), sizeof(float) * static_cast<size_t>(p.var->value.numel()));
    at += p.var->value.numel();
  }
  const auto t0 = std::chrono::steady_clock::now();
  comm.sum_floats(flat.data(), total);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  at = 0;
  for (Parameter& p : params) {
    std::memcpy(p.var->grad.data<float>(), flat.data() + at, sizeof(float) * static_cast<size_t>(p.var->value.numel()));
    at += p.var->value.numel();
  }
  return waited;
}

}  // namespace qkv
