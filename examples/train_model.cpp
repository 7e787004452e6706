// Tensor-parallel training of any example model (examples/models) with a
// YAML plan: train_model --model convnet --plan plans/convnet.yaml --ranks 2.
// Same options and output as train_gpt; --help lists the models.
#include "models/train_loop.h"

int main(int argc, char** argv) { return shardplan::examples::train_main(argc, argv, "train_model", "gpt", false); }
