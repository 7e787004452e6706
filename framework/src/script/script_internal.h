#pragma once
// What the script layer's sources share (script_ops.cpp: the TorchScript
// custom operators; script_graph.cpp: reading and editing inlined graphs;
// script.cpp: the plan applied). Not installed.
#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardplan/communicator.h"

namespace shardplan::script_detail {

// The op names the rewrite inserts (script_ops.cpp registers their schemas).
inline const torch::jit::Symbol kCopyTo = torch::jit::Symbol::fromQualString("shardplan::copy_to");
inline const torch::jit::Symbol kReduceFrom = torch::jit::Symbol::fromQualString("shardplan::reduce_from");
inline const torch::jit::Symbol kGatherFrom = torch::jit::Symbol::fromQualString("shardplan::gather_from");
inline const torch::jit::Symbol kScatterTo = torch::jit::Symbol::fromQualString("shardplan::scatter_to");
inline const torch::jit::Symbol kVocabEmbedding = torch::jit::Symbol::fromQualString("shardplan::vocab_embedding");

// Graphs carry integers, not communicators: the id under which `group` is
// found while it lives (the World owns it; an op run after that throws).
int64_t register_group(const std::shared_ptr<Communicator>& group);

// Inlines every call of method `name` of `m` into its graph (in place: the
// clone's own function) and returns it. Throws naming the call and its source
// when one cannot be inlined (an interface method).
std::shared_ptr<torch::jit::Graph> inlined_graph(torch::jit::Module& m, const std::string& name);
// Every node of `b` and of the blocks nested in it (if, loop), in order.
std::vector<torch::jit::Node*> all_nodes(torch::jit::Block* b);
// The dotted path of a value reached from `self` through prim::GetAttr only
// ("blocks.0.attn.q.weight"; "" for self), or nullopt for any other value.
std::optional<std::string> attr_path(torch::jit::Value* v, torch::jit::Value* self);
// "file:line:col" of the Python source a node came from, or "<unknown source>".
std::string where(const torch::jit::Node* n);
// Inserts `value` = op(args...) right after `x` is defined (at the start of
// its block for an input), so it dominates every use of `x`.
torch::jit::Value* insert_after_def(torch::jit::Graph& g, torch::jit::Value* x, torch::jit::Symbol op,
                                    std::vector<torch::jit::NamedValue> args);

}  // namespace shardplan::script_detail
