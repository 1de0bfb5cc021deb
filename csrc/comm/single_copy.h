// Single copy between processes on one host: read pieces of another process's memory straight
// into pieces of ours (Linux cross-memory attach, process_vm_readv). The ring's MPI transport
// uses it (backends/mpi/mpi_transport); it needs no MPI, so tests run it on their own process.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor_ref.h"

namespace hvdl {

// True where the platform has process_vm_readv (whether the kernel permits it is probed by use).
bool SingleCopyBuilt();

// Copies the bytes of `remote` (addresses in process `pid`; Span counts are bytes) into `local`,
// in order. Both must describe the same number of bytes; the piece boundaries may differ.
Status ReadFromProcess(int64_t pid, const std::vector<Span>& local,
                       const std::vector<Span>& remote);

}  // namespace hvdl
