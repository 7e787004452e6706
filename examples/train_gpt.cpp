// Tensor-parallel training of the example GPT (examples/models/gpt.h) on the
// byte-level corpus shipped in examples/data, with a YAML plan.
//
//   train_gpt --plan plans/gpt.yaml --ranks 2        ranks as threads (local backend)
//   shardplan launch -n 2 --backend gloo -- train_gpt --plan plans/gpt.yaml
//   train_gpt                                         one rank, unsharded
//
// Prints the parameter bytes each rank holds, the bytes one training step
// communicates next to the minimum plans/gpt.yaml needs, then the loss and
// tokens/s every --log-every steps; with --generate N it then samples N bytes
// after --prompt with the sharded model (examples/models/generate.h) and
// prints the text, each rank's key/value cache bytes and the tokens/s.
// Every option: train_gpt --help.
#include "models/train_loop.h"

int main(int argc, char** argv) { return shardplan::examples::train_main(argc, argv, "train_gpt", "gpt", true); }
