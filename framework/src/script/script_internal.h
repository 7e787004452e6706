#pragma once
// What the script layer's sources share (script_ops.cpp: the TorchScript
// custom operators; script_graph.cpp: reading and editing inlined graphs;
// script.cpp: the plan applied). Not installed.
#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/script.h"
#include "shardplan/script_rewrite.h"

namespace shardplan::script_detail {

// The op names the rewrite inserts (script_ops.cpp registers their schemas).
inline const torch::jit::Symbol kCopyTo = torch::jit::Symbol::fromQualString("shardplan::copy_to");
inline const torch::jit::Symbol kReduceFrom = torch::jit::Symbol::fromQualString("shardplan::reduce_from");
inline const torch::jit::Symbol kGatherFrom = torch::jit::Symbol::fromQualString("shardplan::gather_from");
inline const torch::jit::Symbol kScatterTo = torch::jit::Symbol::fromQualString("shardplan::scatter_to");
inline const torch::jit::Symbol kVocabEmbedding = torch::jit::Symbol::fromQualString("shardplan::vocab_embedding");
inline const torch::jit::Symbol kVocabCrossEntropy =
    torch::jit::Symbol::fromQualString("shardplan::vocab_cross_entropy");

// Graphs carry integers, not communicators: the id under which `group` is
// found while it lives (the World owns it; an op run after that throws).
int64_t register_group(const std::shared_ptr<Communicator>& group);

// Inlines every call of method `name` of `m` into its graph (in place: the
// clone's own function) and returns it. Throws naming the call and its source
// when one cannot be inlined (an interface method).
std::shared_ptr<torch::jit::Graph> inlined_graph(torch::jit::Module& m, const std::string& name);
// The same on any graph (`name` is the method's, for the error).
void inline_calls(torch::jit::Graph& g, const std::string& name);
// Every node of `b` and of the blocks nested in it (if, loop), in order.
std::vector<torch::jit::Node*> all_nodes(torch::jit::Block* b);
// The dotted path of a value reached from `self` through prim::GetAttr only
// ("blocks.0.attn.q.weight"; "" for self), or nullopt for any other value.
std::optional<std::string> attr_path(torch::jit::Value* v, torch::jit::Value* self);
// A class's qualified name without TorchScript's mangling:
// "__torch__.x.___torch_mangle_3.Linear" -> "__torch__.x.Linear".
std::string unmangled_type_name(const std::string& qualified_name);
// "file:line:col" of the Python source a node came from, or "<unknown source>".
std::string where(const torch::jit::Node* n);
// "file:line" of a node the tracer recorded, or nullopt when `g` has none.
std::optional<std::string> traced_at(torch::jit::Graph& g);

// Cloning registers types and functions in the module's compilation unit,
// which ranks that are threads share and which is not thread-safe.
std::mutex& jit_mutex();

// parallelize_script less the verification a traced module needs: what
// verify_script runs to produce it.
ScriptParallel parallelize_unverified(const torch::jit::Module& module, const Plan& plan, World& world,
                                      const ScriptOptions& options);

// The rewrites the registry starts with (script_builtin.cpp: aten::linear,
// aten::embedding; script_matmul.cpp: aten::t feeding aten::matmul or
// aten::addmm), keyed by op kind and input.
using RewriteList = std::vector<std::pair<std::pair<std::string, size_t>, ScriptRewrite>>;
RewriteList builtin_rewrites();
RewriteList matmul_rewrites();

// [axis, null] (true) or [null, axis] (false) for a 2-D weight of `op`;
// throws naming the layout otherwise.
bool rows_split(const Layout& layout, const std::string& op);
// The bias of a row-parallel product, added after its reduction.
void add_after(torch::jit::Graph& g, torch::jit::Value* reduced, torch::jit::Value* bias);

// Inserts `value` = op(args...) right after `x` is defined (at the start of
// its block for an input), so it dominates every use of `x`.
torch::jit::Value* insert_after_def(torch::jit::Graph& g, torch::jit::Value* x, torch::jit::Symbol op,
                                    std::vector<torch::jit::NamedValue> args);

}  // namespace shardplan::script_detail
