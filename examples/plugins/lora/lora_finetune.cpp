// LoRA fine-tuning under tensor parallelism, with a layer plugin built out of
// tree (docs/WRITING_PLUGINS.md):
//   SHARDPLAN_PLAN_PLUGINS=1 ./lora_finetune lora.yaml [ranks=2] [steps=200]
// A frozen TinyLoRA learns to imitate a "teacher": the same base with a
// low-rank change, which an adapter of that rank can represent exactly. The
// ranks are threads of this process; the plan loads the plugin from its
// `plugins:` folder. At the end the adapters are saved alone
// (adapters.pt, whole tensors that load at any world size, see
// lora::load_adapters) and merged into the base for serving.
#include <torch/torch.h>

#include <iostream>

#include "lora_linear.h"
#include "shardplan/count_option.h"
#include "shardplan/parallelize.h"
#include "shardplan/plan.h"
#include "shardplan/world.h"
#include "tiny_model.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: lora_finetune PLAN [ranks=2] [steps=200]\n";
    return 2;
  }
  try {
    const auto plan = shardplan::load_plan(argv[1]);
    const int ranks = argc > 2 ? shardplan::count_option_int("ranks", argv[2], 1, 4096) : 2;
    const int steps = argc > 3 ? shardplan::count_option_int("steps", argv[3], 0) : 200;
    torch::manual_seed(0);
    lora::TinyLoRA student(32, 64, 16, 4, 8.0);
    auto teacher = std::dynamic_pointer_cast<lora::TinyLoRAImpl>(student->clone());
    {
      torch::NoGradGuard no_grad;
      for (auto* fc : {&teacher->fc1, &teacher->fc2}) (*fc)->lora_B.normal_(0, 0.3);
    }
    const at::Tensor x = torch::randn({64, 8, 32});
    const at::Tensor target = teacher->forward(x).detach();

    shardplan::run_ranks_in_threads(ranks, [&](shardplan::World& world) {
      auto model = std::dynamic_pointer_cast<lora::TinyLoRAImpl>(student->clone());
      const auto report = shardplan::parallelize(*model, plan, world);
      if (world.rank() == 0) std::cout << report.table() << "\n";
      torch::optim::Adam adam(lora::freeze_base(*model), torch::optim::AdamOptions(1e-2));
      for (int step = 1; step <= steps; ++step) {
        adam.zero_grad();
        at::Tensor loss = torch::mse_loss(model->forward(x), target);
        loss.backward();
        adam.step();
        if (world.rank() == 0 && (step == 1 || step % 50 == 0))
          std::cout << "step " << step << " loss " << loss.item<double>() << "\n";
      }
      const auto adapters = lora::adapter_state_dict(*model, report, world);
      if (world.rank() == 0) lora::save_adapters(adapters, "adapters.pt");
      torch::NoGradGuard no_grad;
      const at::Tensor before = model->forward(x);
      model->merge();
      const double moved = (model->forward(x) - before).abs().max().item<double>();
      if (world.rank() == 0)
        std::cout << "saved " << adapters.size() << " adapter tensors to adapters.pt; merged, output moved by "
                  << moved << "\n";
    });
  } catch (const std::exception& e) {
    std::cerr << "lora_finetune: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
