#pragma once
// Internal: DataParallel's state, shared with ZeroOptimizer.
#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardplan/data_parallel.h"
#include "shardplan/nn/param_gate.h"

namespace shardplan {

// data_parallel.reduce_dtype as a ScalarType (Undefined when unset).
at::ScalarType reduce_dtype_of(const DataParallelSpec& spec);

struct DataParallel::GatedLayerInfo {
  std::string path;
  nn::GatedLayer* layer = nullptr;
  std::vector<std::string> params;  // its own parameters' paths
};

struct DataParallel::Impl {
  struct Entry {
    std::string path;
    at::Tensor param;
    size_t bucket = 0;
    int64_t offset = 0;  // in the bucket's flat buffer
    bool ready = false;  // its gradient of this step is in the bucket
    bool used = false;   // this rank had a gradient for it this step
    bool accumulated = false;  // main grads: its slot holds this step's sum so far
    unsigned hook = 0;
    // Its numel and shape, fixed: under ZeRO-3 the parameter itself holds
    // one NaN between uses.
    int64_t numel = 0;
    std::vector<int64_t> sizes;
    int unit = -1;  // ZeRO-3: index into units, or -1 (kept whole)
  };
  struct Bucket {
    GradBucket info;
    std::vector<size_t> entries;
    // [padded] gradients, then their sum. ZeRO-2: allocated when the
    // bucket's first gradient arrives and released once its reduce-scatter
    // completes (only `shard` outlives it); see ensure_flat().
    at::Tensor flat;
    at::TensorOptions options;  // the flat buffer's
    // ZeRO: [padded / D] this rank's slice of the sum. ZeRO-1: a view of
    // its part of `flat` (the reduce-scatter lands in `scattered`, copied
    // in once complete), so it costs no memory of its own; ZeRO-2: its own.
    at::Tensor shard, scattered;
    at::Tensor scale;  // 1/D in the bucket's dtype: gradients enter divided
    at::Tensor carry;  // a reduced slice (ZeRO) or bucket (main grads) no step consumed yet, added to the next one
    at::Tensor wire, wire_shard;  // data_parallel.reduce_dtype: the bucket (and slice) as the collective sees it
    // ZeRO-3, a unit's bucket: this rank's slice of the unit's parameters,
    // [padded / D], elements [rank * padded / D, (rank + 1) * padded / D) of
    // the parameters flattened in bucket order (the ZeroOptimizer steps it).
    at::Tensor params;
    int unit = -1;
    // The last bucket of a plain all-reduce: after its `padded` gradients,
    // one 0/1 per entry, whether this rank used it (see used_anywhere()).
    int64_t flags = 0;
    size_t pending = 0;
    bool launched = false;
    std::unique_ptr<Work> work;
  };

  std::string axis;
  // A pipelined plan's pipe axis: this DataParallel is over one stage's
  // parameters, whose gradients the other stages do not hold.
  std::string pipe_axis;
  int size = 1, rank = 0;
  int zero = 0;  // the ZeRO stage (data_parallel.zero)
  // ZeRO: entries whose gradient is in its bucket but whose .grad
  // autograd sets right after the hook; dropped at the next hook.
  std::vector<size_t> to_release;
  size_t next_drain = 0;  // ZeRO-2: buckets before it were waited for and released
  bool overlap = true;
  std::shared_ptr<Communicator> group;
  std::vector<std::shared_ptr<Communicator>> axis_groups;  // every mesh axis, for check_replicas
  std::vector<std::string> axis_names;
  std::vector<std::vector<std::string>> axis_split;  // per axis: paths split over it
  std::vector<Entry> entries;
  std::vector<Bucket> buckets;
  std::vector<GradBucket> bucket_infos;
  std::vector<std::string> averaged, ignored, split, warnings;
  std::vector<std::string> ignored_as;  // per ignored parameter, the name its ignore entry matched
  std::vector<std::pair<std::string, at::Tensor>> unique;  // every unique parameter, registration order
  std::vector<ReportRow> unique_rows;  // the report's row of each (a default one where it has none)
  // For clip_grad.h: who counts which gradient, and the world to add the parts over.
  Mesh mesh;
  int world_rank = 0;
  std::shared_ptr<Communicator> world;
  int no_sync = 0;
  size_t next_launch = 0;
  double wait_seconds = 0;
  bool zero_attached = false;
  // A reduction round runs from the first gradient a backward outside
  // NoSync hands a hook to the end of that backward (or finish()).
  bool round_open = false;
  // The .grad (ZeRO: the slices) hold the average of everything backward
  // produced since: finish() has nothing to do.
  bool finished = false;
  bool zero_unconsumed = false;  // ZeRO: slices reduced but not stepped with yet
  std::vector<bool> zero_used;   // ZeRO and main grads: per entry, used on some rank since the last step
  // Mixed precision (shardplan/mixed_precision.h): gradients accumulate in
  // this dtype in the buckets themselves, across micro-batches and
  // backwards (Megatron's main_grad), and the model's .grad is dropped as
  // each arrives. Undefined: they accumulate in .grad, in the model's dtype.
  at::ScalarType main_dtype = at::ScalarType::Undefined;
  bool main_unconsumed = false;  // main grads, no ZeRO: the buckets hold averages no step used yet
  // data_parallel.reduce_dtype: the collectives run in this dtype
  // (Undefined: the buckets').
  at::ScalarType wire_dtype = at::ScalarType::Undefined;
  std::vector<std::pair<std::string, at::Tensor>> to_average;  // what the buckets hold, registration order
  int64_t bucket_bytes = 0, first_bucket_bytes = 0;
  std::weak_ptr<Impl> self;
  std::mutex mu;  // hooks may run on autograd's device threads

  // ZeRO-3 (zero3.cpp): each shardplan::nn layer's own averaged parameters
  // are a unit with a bucket of its own; between uses they hold one NaN each.
  struct Unit {
    std::string layer;  // its module path
    nn::GatedLayer* gated = nullptr;
    size_t bucket = 0;
    bool whole = true;
    size_t arrived = 0;  // gradients of its parameters since it was last gathered
    bool done = false;   // all arrived: free it at the next chance
    int position = -1;   // in the forward order
    std::unique_ptr<Work> prefetch;  // an all-gather started ahead of its use
    at::Tensor incoming;             // ... into this buffer
  };
  std::vector<Unit> units;
  std::map<std::string, int> unit_of_path;
  bool release_queued = false;  // a callback frees every unit when this backward ends
  int hold = 0;                 // WholeParameters scopes open: nothing is freed
  // The units in the order the first forward met them (known once its
  // backward ended): a gate prefetches the next units in forward and the
  // previous ones in backward.
  std::vector<size_t> order;
  bool order_known = false;
  // SHARDPLAN_ZERO3_PREFETCH=0 at construction: every gather waits in full
  // (benchmarks measure what prefetching hides against it).
  bool prefetch = true;
  // How far ahead a gate prefetches, in whole-unit bytes: twice the largest
  // unit, so memory holds at most the unit in use and about two more (FSDP's
  // limit_all_gathers also allows two in flight).
  int64_t prefetch_window_bytes = 0;
  GatherStats gather_stats;
  bool stage3() const { return zero == 3; }
  // Assigns units to the averaged parameters of `layers` (a parameter tied
  // to another path stays whole): before build_buckets.
  void plan_units(const std::vector<GatedLayerInfo>& layers,
                  const std::vector<std::pair<std::string, at::Tensor>>& parameters);
  // After build_buckets: cuts the slices, frees the parameters, installs the gates.
  void shard_units();
  // Copies into b.params the parameters' elements its slice covers.
  void write_slice(Bucket& b) const;
  void gather_unit(size_t u);   // whole (collective over the batch axis)
  // After gathering u for a forward (+1) or a backward (-1): starts the
  // all-gathers of the units next in that direction, within the window.
  void prefetch_after(size_t u, int direction);
  void drop_prefetches();
  void note_peaks();  // gather_stats' peaks (under mu)
  void release_unit(size_t u);  // one NaN again
  void release_done_units(size_t except);
  void release_all_units();
  void hold_whole();     // WholeParameters: gathers every unit and keeps it whole
  void unhold_whole();   // writes this rank's slices back and frees them
  void note_unit_grad(const Entry& e);  // a gradient of a unit's parameter arrived (under mu)
  void remove_gates();

  bool main() const { return main_dtype != at::ScalarType::Undefined; }
  bool zero2() const { return zero >= 2; }
  at::Tensor& ensure_flat(Bucket& b);
  // ZeRO-2: drops the .grad of entries already in their buckets, and waits
  // for (and releases) every bucket launched more than `keep` launches ago.
  void release_grads();
  void drain(size_t keep);
  void on_grad(size_t index, const at::Tensor& grad);
  void on_main_grad(size_t index, const at::Tensor& grad);
  // Packs `to_average` into buckets of their (or main_dtype's) dtype and
  // hooks them (data_parallel_buckets.cpp).
  void build_buckets();
  void remove_hooks();
  // Switches to main grads in `dtype`, rebuilding the buckets: before any
  // backward. `all_trainable`: without a batch axis, every trainable parameter.
  void use_main_grads(at::ScalarType dtype, const std::vector<std::pair<std::string, at::Tensor>>& all_trainable);
  // The main grads' view of entry i, shaped like its parameter.
  at::Tensor main_grad(size_t i) const;
  // zero_grad() with main grads: drops what the buckets accumulated.
  void discard_main_grads();
  void finish_wire(Bucket& b);
  // ZeRO-1: slices no step consumed yet set aside before gradients
  // overwrite `flat`, where they live.
  void keep_zero_unconsumed();
  // Main grads without ZeRO: averages no step used yet move aside before
  // the buckets accumulate again, and are added back when they are averaged.
  void keep_main_unconsumed();
  void open_round();
  // Opens a round (unless open) completed by the end of the running backward.
  void open_round_until_backward_ends();
  // entries[index], whose gradient just arrived: an error if it did already this round.
  Entry& arriving(size_t index);
  void complete();
  void launch_ready();
  void launch(Bucket& b);
  void fill_and_launch_rest();
  std::vector<bool> used_anywhere();
  int64_t wire_size(const GradBucket& b) const {
    return wire_dtype == at::ScalarType::Undefined ? b.element_size : static_cast<int64_t>(c10::elementSize(wire_dtype));
  }
  // The used flags ride in the last bucket's all-reduce (no ZeRO: its
  // reduce-scatter would leave each rank a slice of them).
  bool folds_flags() const { return !zero && size > 1 && group && !buckets.empty(); }
  // Writes the last bucket's flags into its tail, before it launches.
  void write_flags(Bucket& b);
  // What the used flags add to the all-reduces each step: an element of the
  // last bucket's (wire) dtype per parameter, or an int32 of their own call.
  int64_t flag_bytes() const {
    if (size <= 1) return 0;
    const int64_t each = folds_flags() ? wire_size(buckets.back().info) : 4;
    return static_cast<int64_t>(entries.size()) * each;
  }
};

}  // namespace shardplan
