#pragma once
// Internal: what clip_grad.cpp shares with clip_grad_script.cpp and replicas.cpp.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "grad_norm_internal.h"

namespace shardplan {

struct ParallelReport;
class World;

// The gradient pieces of a model's parameters by path (named_parameters()
// order, a tied tensor under each of its paths), counted by the ownership
// rule of their report rows. Throws naming the first parameter the report
// does not describe (or a report of another rank or world), before any
// communication. `who`: the function named in the error.
std::vector<GradPiece> named_pieces(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                    const ParallelReport& report, World& world, const char* who);
// Checks the report describes the model (as named_pieces), without the pieces.
void check_report_describes(const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const ParallelReport& report, World& world, const char* who);
// grad_norm and clip_grad_norm_ of a model given by its parameters by path.
double named_grad_norm(const std::vector<std::pair<std::string, at::Tensor>>& params, const ParallelReport& report,
                       World& world, double norm_type, bool error_if_nonfinite);
double named_clip_grad_norm(const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const ParallelReport& report, World& world, double max_norm, double norm_type,
                            bool error_if_nonfinite);

}  // namespace shardplan
