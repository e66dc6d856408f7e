// qkv/distributed.h: what data-parallel training needs from the processes it runs in.
//
// A Communicator connects N ranks (processes started together, e.g. by mpirun). The library
// only uses this interface; the command line implements it on Open MPI (tools/mpi_comm.cpp) when
// qkv is built with MPI, and a single process uses none. Every reduction here sums in rank order
// 0, 1, ..., N-1 whatever the transport's own algorithms would choose, so N ranks give the same
// bits on every rank and on every run (MPI_Allreduce's order may change with the message size,
// the process placement or the library version).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qkv/error.h"

namespace qkv {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data <- sum over ranks of every rank's data (n floats), summed in rank order: on every rank
  // element i is ((x_0[i] + x_1[i]) + x_2[i]) + ... in float32.
  virtual void sum_floats(float* data, int64_t n) = 0;
  // The same, without waiting: start_sum() begins summing data (the sum lands in data, as
  // sum_floats leaves it), progress() lets started sums advance (call it often while computing),
  // wait_all() returns once every started sum has landed. Every rank starts the same sums (sizes)
  // in the same order. The default sums at once.
  virtual void start_sum(float* data, int64_t n) { sum_floats(data, n); }
  virtual void progress() {}
  virtual void wait_all() {}
  // The same for doubles (token counts, losses: small vectors).
  virtual void sum_doubles(double* data, int64_t n) = 0;
  // bytes of rank `root` to every rank (each passes a buffer of the same size).
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // A byte string of rank `root` to every rank (any length).
  void broadcast_string(std::string& s, int root);
  virtual void barrier() = 0;
  // Point to point: `bytes` bytes to rank dest, which receives them with recv(..., source) into a
  // buffer of the same size. Sends to different ranks and collectives do not mix up.
  virtual void send(const void* data, int64_t bytes, int dest) = 0;
  virtual void recv(void* data, int64_t bytes, int source) = 0;
  // A byte string (any length) to one rank, and its receipt.
  void send_string(const std::string& s, int dest);
  std::string recv_string(int source);
};

// Work that rank 0 alone does (reading files, tokenising) while the others wait for its outcome:
// run `work` on rank 0 and tell every rank whether it failed. Rank 0 rethrows its own error; the
// other ranks throw FailedOnLead, which carries rank 0's message (printed once, by rank 0).
struct FailedOnLead : Error {
  using Error::Error;
};
void on_lead(Communicator& comm, const std::function<void()>& work);

struct SafetensorsFile;
// A .safetensors file's contents (tensors and metadata) from rank `root` to every rank; the
// others' `f` is replaced.
void broadcast_safetensors(Communicator& comm, SafetensorsFile& f, int root);

// FNV-1a over bytes, continuing from h: a checksum of parameters, to assert that ranks agree.
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull);
// True on every rank when every rank passed the same value.
bool same_on_every_rank(Communicator& comm, uint64_t value);

}  // namespace qkv
