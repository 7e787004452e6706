#pragma once
// Header-only help for layer-plugin authors: reporting a plan problem where
// the user wrote it, and reading the rule options that several layers share.
// Every layer plugin validates its layouts and options the same way
// (LayerPlugin::check: PlanError at the rule's location, or shardplan::Error
// naming the parameter), so the wording and locations live here once and
// the plugins agree on them. What differs per layer (which layouts mean what,
// which options apply) stays in each plugin. Inline, so plugins gain no link
// dependency and the layer ABI is unchanged.
#include <cstdint>
#include <string>

#include "shardplan/error.h"
#include "shardplan/layer_plugin.h"
#include "shardplan/plan.h"

namespace shardplan {

// The rule that placed this parameter, or nullptr (no parameter, or one no
// rule matched).
inline const Rule* rule_of(const ParamShard* p) { return p ? p->assignment.rule : nullptr; }

// The parameter `name` of the module; throws Error naming the module when it
// has none (a plugin registered for a type that lacks it).
inline const ParamShard* required_param(const ModuleShard& shard, const std::string& name) {
  const ParamShard* p = shard.param(name);
  if (!p) throw Error("module '" + shard.path + "' of type " + shard.type + " has no " + name);
  return p;
}

// Throws "parameter '<path>': <message>": a PlanError at the rule's `layout:`
// when a rule placed the parameter, else a plain Error.
[[noreturn]] inline void fail_param(const ParamShard& p, const std::string& message) {
  const std::string text = "parameter '" + p.assignment.path + "': " + message;
  if (p.assignment.rule) throw PlanError(p.assignment.rule->layout_loc, text);
  throw Error(text);
}

// Throws PlanError "option '<key>' <why>" at the option when `rule` sets `key`
// (an option that does not apply to this layer or layout); no-op otherwise.
inline void reject_option(const Rule* rule, const std::string& key, const std::string& why) {
  if (!rule) return;
  if (const RuleOption* o = rule->option(key)) throw PlanError(o->loc, "option '" + key + "' " + why);
}

// `output: gathered | sharded` of a layer that can gather its split output
// (default gathered, also without a rule). Other values throw PlanError.
inline bool output_option_gathered(const Rule* rule) {
  return !rule || rule->option_or("output", "gathered", {"gathered", "sharded"}) == "gathered";
}

// `input: replicated | sharded` of a layer that can take its input already
// split (default replicated, also without a rule). Other values throw
// PlanError.
inline bool input_option_sharded(const Rule* rule) {
  return rule && rule->option_or("input", "replicated", {"replicated", "sharded"}) == "sharded";
}

// ", sequence-parallel (dim d)" for a module in the sequence-parallel
// region, "" outside it: the words every plugin's notes and describe() use.
inline std::string sequence_note(const SequenceShard& seq) {
  return seq.on ? ", sequence-parallel (dim " + std::to_string(seq.dim) + ")" : "";
}

// Declares that `p` is cut along `dim` over `axis`, reading the dim as
// `blocks` stacked blocks, each piece held by `shared` ranks
// (ParamShard::splits, ShardSplit::shared).
inline void declare_split(ParamShard& p, int64_t dim, const std::string& axis, int64_t blocks = 1,
                          int64_t shared = 1) {
  ShardSplit s;
  s.dim = dim;
  s.axis = axis;
  s.blocks = blocks;
  s.shared = shared;
  p.splits.push_back(s);
}

// check() bookkeeping for a layer whose weight is [out, in, ...] with an
// optional bias [out] (Linear, convolutions): local shapes and notes for each
// way of splitting it. What the split means at run time stays in the plugin.

// Weight and bias whole on every rank.
inline void note_replicated(ParamShard& w, ParamShard* b) {
  w.note = "replicated";
  if (b) b->note = "replicated";
}

// Weight split into `parts` over `axis` along dim 0 (outputs), the bias
// with it; with `blocks` > 1 each of that many stacked blocks is split.
// `kind` names the layout ("column-parallel"); the bias note adds ",
// follows weight" when no rule of its own placed the bias.
inline void note_output_split(ParamShard& w, ParamShard* b, const std::string& axis, int64_t parts,
                              const std::string& kind, const std::string& weight_note, int64_t blocks = 1) {
  w.local_shape[0] /= parts;
  w.note = weight_note;
  declare_split(w, 0, axis, blocks);
  if (b) {
    b->local_shape[0] /= parts;
    b->note = rule_of(b) ? kind : kind + ", follows weight";
    declare_split(*b, 0, axis, blocks);
  }
}

// Weight split into `parts` over `axis` along dim 1 (inputs): partial
// results are reduced, so the bias stays whole and is added once after the
// reduction.
inline void note_input_split(ParamShard& w, ParamShard* b, const std::string& axis, int64_t parts,
                             const std::string& weight_note) {
  w.local_shape[1] /= parts;
  w.note = weight_note;
  declare_split(w, 1, axis, 1);
  if (b) b->note = "replicated, added after the reduction";
}

}  // namespace shardplan
