// The shared-memory region moved to the harness (cpkv/harness/shared_region.hpp), which the GPU
// backend uses too; these names keep the simulator's spelling.
#pragma once

#include "cpkv/harness/shared_region.hpp"

namespace cpkv::sim {

using harness::region_exists;
using harness::SharedMemoryFull;
using harness::SharedRegion;
using harness::shm_free_bytes;
using harness::sweep_stale_regions;

}  // namespace cpkv::sim
