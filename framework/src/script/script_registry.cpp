// The registry of TorchScript rewrites, keyed by the op a planned parameter
// feeds and the input it is. The built-in rewrites are registered when the
// registry is first used, not by static initializers, which a static link
// of the library could drop.
#include <map>
#include <mutex>

#include "script_internal.h"
#include "shardplan/script_rewrite.h"

namespace shardplan {

namespace {

using Key = std::pair<std::string, size_t>;

struct RewriteRegistry {
  std::mutex mu;
  std::map<Key, ScriptRewrite> rewrites;
};

RewriteRegistry& rewrite_registry() {
  static RewriteRegistry* r = [] {
    auto* made = new RewriteRegistry;
    for (auto& [key, rewrite] : script_detail::builtin_rewrites()) made->rewrites[key] = std::move(rewrite);
    return made;
  }();
  return *r;
}

}  // namespace

void register_script_rewrite(const std::string& kind, size_t input, ScriptRewrite rewrite) {
  RewriteRegistry& r = rewrite_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.rewrites[{kind, input}] = std::move(rewrite);
}

const ScriptRewrite* find_script_rewrite(const std::string& kind, size_t input) {
  RewriteRegistry& r = rewrite_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.rewrites.find({kind, input});
  return it == r.rewrites.end() ? nullptr : &it->second;
}

std::string script_rewrite_keys() {
  RewriteRegistry& r = rewrite_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string out;
  for (const auto& kv : r.rewrites)
    out += (out.empty() ? "" : ", ") + kv.first.first + " (input " + std::to_string(kv.first.second) + ")";
  return out;
}

}  // namespace shardplan
