#pragma once
// The training driver shared by the example programs (train_gpt,
// train_model): parses the command line, runs ranks as threads or joins the
// launcher's world, shards the model by the plan, and prints per logging
// step the loss and throughput, and once the parameter bytes per rank and the
// bytes communicated per step next to the model's stated minimum.
#include <string>

namespace shardplan {
namespace examples {

// `program` names the binary in messages; `default_model` is the model when
// no --model is given, and the only one accepted when `fixed_model` is true.
int train_main(int argc, char** argv, const std::string& program, const std::string& default_model, bool fixed_model);

}  // namespace examples
}  // namespace shardplan
