// qkv::Communicator on Open MPI, for `mpirun -np N qkv train ...` (qkv/distributed.h).
#pragma once
#include <memory>

#include "qkv/distributed.h"

namespace qkv::cli {

// True when this process was started by a launcher with N ranks (mpirun, or Slurm's srun with
// PMIx): Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK or PMI's PMI_SIZE is set.
bool launched_by_mpi();
// Ranks on this machine (OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE), 1 when unknown.
int local_ranks();
// MPI_Init and the world communicator; throws qkv::Error when qkv was built without MPI.
std::unique_ptr<Communicator> mpi_world();
bool built_with_mpi();

}  // namespace qkv::cli
