// The parts of data parallelism that do not depend on the transport (qkv/distributed.h).
#include "qkv/distributed.h"

#include <cstring>

namespace qkv {

void Communicator::broadcast_string(std::string& s, int root) {
  double n = static_cast<double>(s.size());
  if (rank() != root) n = 0;
  sum_doubles(&n, 1);  // only the root's length is non-zero
  s.resize(static_cast<size_t>(n));
  if (!s.empty()) broadcast(s.data(), static_cast<int64_t>(s.size()), root);
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
