#pragma once
// Reading a model's config from key=value overrides: each field is taken
// once, and any key no field took is an error that lists the known ones.
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>

#include "models/model.h"
#include "shardplan/error.h"

namespace shardplan {
namespace examples {

class ConfigReader {
 public:
  ConfigReader(std::string model, const Overrides& overrides) : model_(std::move(model)), overrides_(overrides) {}

  void get(const std::string& key, int64_t& field) {
    const std::string* v = take(key);
    if (!v) return;
    size_t used = 0;
    try {
      field = std::stoll(*v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v->size()) bad(key, *v, "an integer");
    if (field < 0) bad(key, *v, "a non-negative integer");
  }
  void get(const std::string& key, double& field) {
    const std::string* v = take(key);
    if (!v) return;
    size_t used = 0;
    try {
      field = std::stod(*v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v->size()) bad(key, *v, "a number");
  }
  void get(const std::string& key, std::string& field) {
    if (const std::string* v = take(key)) field = *v;
  }
  // Throws naming the first key no get() took.
  void finish() const {
    for (const auto& kv : overrides_) {
      if (known_.count(kv.first)) continue;
      std::string keys;
      for (const auto& k : known_) keys += (keys.empty() ? "" : ", ") + k;
      throw Error("model '" + model_ + "' has no config key '" + kv.first + "' (known: " + keys + ")");
    }
  }

 private:
  const std::string* take(const std::string& key) {
    known_.insert(key);
    auto it = overrides_.find(key);
    return it == overrides_.end() ? nullptr : &it->second;
  }
  [[noreturn]] void bad(const std::string& key, const std::string& value, const char* want) const {
    throw Error("model '" + model_ + "': config " + key + "=" + value + " must be " + want);
  }

  std::string model_;
  const Overrides& overrides_;
  std::set<std::string> known_;
};

}  // namespace examples
}  // namespace shardplan
