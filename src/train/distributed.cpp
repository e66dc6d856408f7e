// The parts of data parallelism that do not depend on the transport (qkv/distributed.h).
#include "qkv/distributed.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "qkv/safetensors.h"
#include "qkv/tensor.h"

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

}  // namespace qkv
