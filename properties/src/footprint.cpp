#include "cpkv/properties/footprint.hpp"

#include <algorithm>

#include "cpkv/model/assert.hpp"

namespace cpkv::properties {

bool conflict(const Footprint& a, const Footprint& b) {
  if (a.top || b.top) return true;
  if (a.writes.intersects(b.reads) || a.writes.intersects(b.writes) || a.writes.intersects(b.ors) || a.writes.intersects(b.adds)) return true;
  if (b.writes.intersects(a.reads) || b.writes.intersects(a.ors) || b.writes.intersects(a.adds)) return true;
  // An OR-write and an add do not commute with a read of the same location (the value read differs).
  if (a.ors.intersects(b.reads) || b.ors.intersects(a.reads) || a.adds.intersects(b.reads) || b.adds.intersects(a.reads)) return true;
  return a.ors.intersects(b.adds) || b.ors.intersects(a.adds);
}

Footprints::Footprints(std::int32_t cp, std::int32_t layers, std::int64_t fillers_per_half, harness::Mutant mutant)
    : cp_(cp), layers_(layers), fillers_per_half_(fillers_per_half), mutant_(mutant) {
  CPKV_ASSERT(cp >= 1 && cp * kPerRank <= 512);
  CPKV_ASSERT(fillers_per_half >= 1);
}

// Layers past 32 share a location with layer % 32, and fillers words share 95 locations: a shared
// location only adds dependencies (more interleavings explored), never removes one.
std::int32_t Footprints::shadow_location(std::int32_t layer) const { return 512 + (layer < 0 ? 0 : layer % 32); }
std::int32_t Footprints::fillers_location(std::int32_t half, std::int64_t index) const {
  return 545 + static_cast<std::int32_t>((half * fillers_per_half_ + (index < 0 ? 0 : index)) % 479);
}
namespace {
constexpr std::int32_t kResetLocation = 544;
}

// The read epoch (StateChecker::on_shared_write). A write into half h for layer M reports a peer p
// only if p's epoch holds a layer L != M of half h; p sets its epoch to L (its gathers of layer L)
// and back to -1 (its layer end), so only p's steps of such a layer L can change what the write
// finds: the writer reads "p's epoch is L" for those L, p's steps of layer L write it. With more
// than 16 layers the epoch is one location (every such pair dependent).
void Footprints::read_epochs(Footprint& f, std::int32_t rank, std::int32_t layer, std::int32_t half) const {
  for (std::int32_t p = 0; p < cp_; ++p) {
    if (p == rank) continue;
    if (layers_ > kEpochLayers) {
      f.reads.add(rank_location(p, reading));
      continue;
    }
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (l != layer && (mutant_.halves() == 1 || model::parity_half(l) == half)) f.reads.add(rank_location(p, reading + 1 + l));
    }
  }
}
void Footprints::write_epoch(Footprint& f, std::int32_t rank, std::int32_t layer) const {
  f.writes.add(layers_ > kEpochLayers ? rank_location(rank, reading) : rank_location(rank, reading + 1 + layer));
}

void Footprints::dense_half(LocationSet& set, std::int32_t rank, std::int32_t half) const {
  for (std::int32_t slot = 0; slot < kDenseSlots; ++slot) set.add(rank_location(rank, (half == 0 ? dense0 : dense1) + slot));
}
void Footprints::dense_slot(LocationSet& set, std::int32_t rank, std::int32_t half, std::int64_t slot) const {
  if (slot < 0) return dense_half(set, rank, half);
  set.add(rank_location(rank, (half == 0 ? dense0 : dense1) + static_cast<std::int32_t>(std::min<std::int64_t>(slot, kDenseSlots - 1))));
}
bool Footprints::writes_dense(const Footprint& f, std::int32_t rank, std::int32_t half) const {
  for (std::int32_t slot = 0; slot < kDenseSlots; ++slot) {
    if (f.writes.has(rank_location(rank, (half == 0 ? dense0 : dense1) + slot))) return true;
  }
  return false;
}

void Footprints::all_ranks(LocationSet& set, std::int32_t what, std::int32_t except) const {
  for (std::int32_t p = 0; p < cp_; ++p) {
    if (p != except) set.add(rank_location(p, what));
  }
}

// What each op of machine.cpp reads and writes in the World, its checker's reads included (the
// RankMachine::run_* functions and the StateChecker::on_* they call). Keep in step with them:
// Explorer.FootprintsCoverEveryWrite checks the writes against the bytes each step changes.
Footprint Footprints::of(const sim::RankMachine& m, const sim::Step& s) const {
  Footprint f;
  const std::int32_t r = m.rank();
  const std::int32_t h = m.half(s.layer);
  const auto staging = [&](std::int32_t rank) { return rank_location(rank, h == 0 ? staging0 : staging1); };
  const model::VariantPlan& plan = m.plan();
  const bool peers_read_dense = model::info(m.path_variant()).peer_pages == model::PeerPages::dense;
  switch (s.op) {
    case sim::Op::probe:
    case sim::Op::choose_path: f.top = true; break;  // the prologue: run in one fixed order, never reduced
    case sim::Op::batch_begin:
      dense_half(f.writes, r, 0);
      dense_half(f.writes, r, 1);
      f.writes.add(rank_location(r, pool));
      f.writes.add(rank_location(r, verdict));
      break;
    case sim::Op::layer_begin:
    case sim::Op::batch_end: break;
    case sim::Op::zero_dense: dense_half(f.writes, r, h); break;
    case sim::Op::local_prefix:
      f.reads.add(rank_location(r, pool));
      dense_slot(f.writes, r, h, std::get<sim::SlotStep>(s.operands).slot);
      break;
    case sim::Op::zero_own:
    case sim::Op::fill:
      if (plan.token_split != model::TokenSplit::none && s.op == sim::Op::fill) {
        f.writes.add(rank_location(r, compact));  // section 12: its send rows (its peers' all-gather is top)
      } else if (plan.fill_to_staging) {
        f.writes.add(staging(r));
        read_epochs(f, r, s.layer, h);
      } else {
        dense_half(f.writes, r, h);  // the page inverse's rows: the slot is the layout's (not known here)
        if (peers_read_dense) read_epochs(f, r, s.layer, h);
      }
      if (s.op == sim::Op::fill) f.writes.add(fillers_location(h, std::get<sim::FillStep>(s.operands).current_index));
      break;
    case sim::Op::pack:
      dense_half(f.reads, r, h);
      f.writes.add(rank_location(r, compact));
      break;
    case sim::Op::gather: {
      const auto& g = std::get<sim::GatherStep>(s.operands);
      dense_slot(f.writes, r, h, g.slot);
      if (g.table_index == model::SlotDescriptor::kZeroFill) break;
      const std::int32_t source = g.table_index % cp_;
      if (g.table_index < cp_) {
        f.reads.add(rank_location(source, pool));
        break;
      }
      if (peers_read_dense) {
        dense_slot(f.reads, source, h, g.source_page);
      } else {
        f.reads.add(staging(source));
      }
      if (source != r) write_epoch(f, r, s.layer);
      break;
    }
    case sim::Op::publish:
      dense_half(f.reads, r, h);
      f.writes.add(staging(r));
      read_epochs(f, r, s.layer, h);
      break;
    default: sync_of(m, s, f); break;
  }
  return f;
}

// The barrier, collective and layer-end steps (the rest of Footprints::of).
void Footprints::sync_of(const sim::RankMachine& m, const sim::Step& s, Footprint& f) const {
  const std::int32_t r = m.rank();
  const std::int32_t h = m.half(s.layer);
  switch (s.op) {
    case sim::Op::arrive:
      f.writes.add(rank_location(r, barrier));
      f.ors.add(shadow_location(s.layer));
      if (mutant_.uses_reset_barrier()) f.adds.add(kResetLocation);
      break;
    case sim::Op::wait:
      all_ranks(f.reads, barrier, -1);
      f.reads.add(shadow_location(s.layer));
      if (mutant_.uses_reset_barrier()) f.writes.add(kResetLocation);  // its guard reads it, its body stores 0
      break;
    case sim::Op::coll_arrive: f.writes.add(rank_location(r, collective)); break;
    case sim::Op::coll_wait:
      all_ranks(f.reads, collective, -1);
      all_ranks(f.reads, path, -1);
      break;
    case sim::Op::reduce: {
      const bool compact_range = std::get<sim::CollectiveStep>(s.operands).slot_end == sim::CollectiveStep::kCompact;
      const auto& range = std::get<sim::CollectiveStep>(s.operands);
      for (std::int32_t p = 0; p < cp_; ++p) {
        if (compact_range) {
          f.reads.add(rank_location(p, compact));
          continue;
        }
        for (std::int64_t slot = range.slot_begin; slot < range.slot_end; ++slot) dense_slot(f.reads, p, h, slot);
        if (range.slot_begin < 0 || range.slot_end < range.slot_begin) dense_half(f.reads, p, h);  // a bad range: the step reports it
      }
      break;  // its scratch is this rank's alone
    }
    case sim::Op::store: {
      const bool compact_range = std::get<sim::CollectiveStep>(s.operands).slot_end == sim::CollectiveStep::kCompact;
      const auto& range = std::get<sim::CollectiveStep>(s.operands);
      if (compact_range) {
        f.writes.add(rank_location(r, compact));
      } else if (range.slot_begin < 0 || range.slot_end < range.slot_begin) {
        dense_half(f.writes, r, h);
      } else {
        for (std::int64_t slot = range.slot_begin; slot < range.slot_end; ++slot) dense_slot(f.writes, r, h, slot);
      }
      break;
    }
    case sim::Op::unpack:
      f.reads.add(rank_location(r, compact));
      dense_half(f.writes, r, h);
      break;
    case sim::Op::reorder: dense_half(f.writes, r, h); break;  // section 12: from its own scratch (the all-gather is top)
    case sim::Op::layer_end:
      write_epoch(f, r, s.layer);
      dense_half(f.reads, r, h);
      break;
    case sim::Op::batch_arrive: f.writes.add(rank_location(r, batch)); break;
    case sim::Op::batch_wait:
      all_ranks(f.reads, batch, -1);
      all_ranks(f.reads, verdict, -1);
      all_ranks(f.reads, path, -1);
      break;
    default: f.top = true; break;  // Footprints::of's ops: not reached
  }
}

void Footprints::written_objects(const sim::RankMachine& m, const sim::Step& s, std::vector<std::uint32_t>& out) const {
  const std::uint32_t base = static_cast<std::uint32_t>(m.rank()) * kObjectsPerRank;
  const std::uint32_t dense = m.half(s.layer) == 0 ? obj_dense0 : obj_dense1;
  switch (s.op) {
    case sim::Op::probe:
    case sim::Op::choose_path:
    case sim::Op::layer_begin:
    case sim::Op::arrive:
    case sim::Op::wait:
    case sim::Op::coll_arrive:
    case sim::Op::coll_wait:
    case sim::Op::layer_end:
    case sim::Op::batch_arrive:
    case sim::Op::batch_wait:
    case sim::Op::batch_end: return;  // flags and shadows only
    case sim::Op::batch_begin:
      out.push_back(base + obj_dense0);
      out.push_back(base + obj_dense1);
      out.push_back(base + obj_pool);
      return;
    case sim::Op::zero_own:
    case sim::Op::fill:
    case sim::Op::publish:
      // Section 12's fill writes the rank's send rows (its compact buffer).
      out.push_back(base + (m.plan().token_split != model::TokenSplit::none && s.op == sim::Op::fill ? obj_compact
                            : m.plan().fill_to_staging || s.op == sim::Op::publish                     ? obj_staging
                                                                                                       : dense));
      return;
    case sim::Op::pack: out.push_back(base + obj_compact); return;
    case sim::Op::reduce:
    case sim::Op::all_gather: out.push_back(base + obj_scratch); return;
    case sim::Op::store:
      out.push_back(base + (std::get<sim::CollectiveStep>(s.operands).slot_end == sim::CollectiveStep::kCompact ? obj_compact : dense));
      return;
    case sim::Op::zero_dense:
    case sim::Op::local_prefix:
    case sim::Op::gather:
    case sim::Op::unpack:
    case sim::Op::reorder: out.push_back(base + dense); return;
  }
}

}  // namespace cpkv::properties
