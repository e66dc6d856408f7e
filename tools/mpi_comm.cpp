// Communicator on Open MPI. Sums never use MPI's reductions (whose order of additions depends on
// the algorithm the library picks for a size and a placement): an all-to-all hands rank r the r-th
// chunk of every rank's buffer, rank r adds them in rank order 0, 1, ..., N-1, and an all-gather
// hands every rank every summed chunk. The bytes moved are those of a ring all-reduce,
// 2 (N - 1) / N of the buffer per rank, and the bits are fixed by N alone.
#include "mpi_comm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "qkv/error.h"

#if QKV_HAVE_MPI
#include <mpi.h>
#endif

namespace qkv::cli {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

int local_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* s = std::getenv(v); s && *s) {
      const int n = std::atoi(s);
      if (n >= 1) return n;
    }
  }
  return 1;
}

bool built_with_mpi() { return QKV_HAVE_MPI != 0; }

#if QKV_HAVE_MPI
namespace {

void ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(detail::concat("MPI: ", what, " failed: ", std::string(text, static_cast<size_t>(len))));
}

template <class T>
MPI_Datatype type_of();
template <>
MPI_Datatype type_of<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype type_of<double>() { return MPI_DOUBLE; }

class MpiWorld : public Communicator {
 public:
  MpiWorld() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      ok(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum_floats(float* data, int64_t n) override { sum(data, n); }
  void sum_doubles(double* data, int64_t n) override { sum(data, n); }
  void broadcast(void* data, int64_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (int64_t at = 0; at < bytes; at += kPiece) {
      const int len = static_cast<int>(std::min<int64_t>(kPiece, bytes - at));
      ok(MPI_Bcast(p + at, len, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }
  void barrier() override { ok(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  static constexpr int64_t kPiece = int64_t{1} << 28;  // elements per MPI call (counts are int)

  template <class T>
  void sum(T* data, int64_t n) {
    if (size_ == 1 || n == 0) return;
    const int64_t N = size_;
    for (int64_t at = 0; at < n; at += kPiece * N) {
      const int64_t len = std::min<int64_t>(kPiece * N, n - at);
      const int64_t chunk = (len + N - 1) / N;
      std::vector<T> send(static_cast<size_t>(chunk * N), T(0)), recv(static_cast<size_t>(chunk * N));
      std::copy(data + at, data + at + len, send.begin());
      // recv[j * chunk + i] <- rank j's element r * chunk + i
      ok(MPI_Alltoall(send.data(), static_cast<int>(chunk), type_of<T>(), recv.data(), static_cast<int>(chunk),
                      type_of<T>(), MPI_COMM_WORLD),
         "MPI_Alltoall");
      std::vector<T> mine(recv.begin(), recv.begin() + chunk);
      for (int64_t j = 1; j < N; ++j)
        for (int64_t i = 0; i < chunk; ++i) mine[static_cast<size_t>(i)] += recv[static_cast<size_t>(j * chunk + i)];
      ok(MPI_Allgather(mine.data(), static_cast<int>(chunk), type_of<T>(), send.data(), static_cast<int>(chunk),
                       type_of<T>(), MPI_COMM_WORLD),
         "MPI_Allgather");
      std::copy(send.begin(), send.begin() + len, data + at);
    }
  }

  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> mpi_world() { return std::make_unique<MpiWorld>(); }
#else
std::unique_ptr<Communicator> mpi_world() {
  throw Error("this qkv was built without MPI: install libopenmpi-dev (scripts/install-deps.sh) and rebuild");
}
#endif

}  // namespace qkv::cli
