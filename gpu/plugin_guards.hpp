// What the plugin host checks of a foreign exchange beyond its bytes (issue 35, items 1, 2 and 4),
// each on the device and read where the byte check's results are read:
// - writes outside its buffers: a poisoned guard region past every buffer the host hands the plugin
//   (each dense buffer, each symmetric allocation, each rows buffer), compared with the poison
//   after every layer; and the rank's own pool slabs, hashed per page that has memory behind it
//   after the prefill and compared after every batch (a hash per page, no copy of the slab);
// - the plugin's counters: its reported peer bytes beside the model's for the variant it runs;
// - device faults: milestones the rank's stream stamps into host memory around every plugin call,
//   so a sticky CUDA error names the call whose work faulted (bootstrap.hpp: FaultSite).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rank.hpp"

namespace cpkv::cuda {

// Where the rank's stream got to: a host-mapped word its kernels stamp with increasing values,
// and the name of the work after each value (stamped by launch_stamp, or by the guard check).
class DeviceMilestones {
 public:
  DeviceMilestones();
  ~DeviceMilestones();
  DeviceMilestones(const DeviceMilestones&) = delete;
  DeviceMilestones& operator=(const DeviceMilestones&) = delete;
  // The value a kernel stamps next, with the name of the work enqueued after it.
  std::uint64_t next(std::string work_after);
  void stamp(cudaStream_t stream, std::string work_after);
  std::uint64_t* word() const { return device_word_; }
  // The stream was synchronized without an error: every stamp landed, the names are done.
  void synced() { after_.clear(); }
  // The work the device was running when the context was lost (empty: not a device fault, or
  // after a synchronization: the host's place says it).
  std::string place() const;

 private:
  volatile std::uint64_t* host_word_ = nullptr;
  std::uint64_t* device_word_ = nullptr;
  std::uint64_t issued_ = 0;
  std::map<std::uint64_t, std::string> after_;
};

class PluginGuards {
 public:
  explicit PluginGuards(Rank& r);
  ~PluginGuards();
  PluginGuards(const PluginGuards&) = delete;
  PluginGuards& operator=(const PluginGuards&) = delete;
  // A guard region of the layout's guard_bytes at `base` (the host made the allocation that much
  // longer), poisoned now; `what` names the buffer it follows ("dense buffer of kv half 0").
  void add_region(std::uint8_t* base, std::string what);
  // After setup: the table of regions on the device (every symmetric allocation is made by then).
  void seal();
  // Per batch: the layer results cleared (with the verify results), the pool's reference hashes
  // (after the prefill, before any plugin code of the batch runs: the host barrier follows).
  void begin_batch();
  void hash_pool_reference();
  // After compose_layer's work: the regions compared with the poison, the milestone stamped.
  void check_layer(std::int32_t layer, std::uint64_t* milestone, std::uint64_t milestone_value);
  // After the stream's synchronization: the first layer whose guards changed, as one line (empty:
  // none); the regions are poisoned again, so each write is reported once.
  std::string read_layers(std::int64_t batch);
  // After every rank's layers (the batch's closing host barrier): the pool pages compared with
  // their reference, as one line (empty: none). Synchronizes the stream.
  std::string check_pool(std::int64_t batch);
  // The dense buffers' garbage before a batch (as populate writes it) without their guards.
  void garbage_dense();

 private:
  Rank& r_;
  std::vector<kernels::GuardRegion> regions_;
  std::vector<std::string> region_names_;
  kernels::GuardRegion* regions_dev_ = nullptr;
  kernels::GuardResult* results_ = nullptr;  // [layers]
  std::int32_t layers_ = 0;
  // The own pool slabs' pages with memory behind them, their names, hashes and the compare result.
  std::vector<kernels::HashedPage> pages_;
  std::vector<std::uint32_t> page_slab_;    // [page]: layer * kinds + kind
  std::vector<std::int64_t> page_local_;    // [page]: the local page
  kernels::HashedPage* pages_dev_ = nullptr;
  std::uint64_t* reference_ = nullptr;
  kernels::HashCompare* compare_ = nullptr;
  void list_pool_pages();
};

// The model's bytes a rank's gathers read from its peers over one batch's layers under `variant`
// (model::layer_bytes of the variant's plan, without the ring all-reduce's receive volume, which
// the model adds to the same figure): what a plugin's bytes_gathered_from_peers must say.
std::uint64_t model_peer_gather_bytes(const model::Setting& setting, const model::BatchLayout& layout, model::Variant variant, std::int32_t rank,
                                      std::int32_t layers);

}  // namespace cpkv::cuda
