// A pickle machine for torch.save's state dicts (pickle_reader.h): the
// opcodes of protocols 2-5 that Python's pickler emits for dicts, tuples,
// strings, numbers and the globals of a state dict; storages come as
// persistent ids ('storage', torch.FloatStorage, key, location, numel).
#include "weights/pickle_reader.h"

#include <cstring>
#include <deque>
#include <map>

#include "shardplan/error.h"

namespace shardplan::weights_detail {

namespace {

struct Value;
// Values live in the machine's arena and point at each other with plain
// pointers: a file's nesting (400,000 nested tuples) or its cycles (a list
// appended to itself through the memo) are then freed in one flat pass,
// never by a destructor recursing once per level.
using Ref = Value*;

// Deeper than any state dict nests (dict -> tensor -> args -> shape, about
// 5); the bound makes such a file an error rather than a walk to nowhere.
constexpr int kMaxDepth = 64;

struct Value {
  enum Kind { None, Bool, Int, Float, Str, Tuple, List, Dict, Global, Storage, Tensor } kind = None;
  int64_t i = 0;
  std::string s;                      // Str; Global: "module.name"; Storage: key
  std::string storage_type;           // Storage
  std::vector<Ref> items;             // Tuple, List; Tensor: {storage}
  std::vector<std::pair<Ref, Ref>> dict;
  PickledTensor tensor;
  // Levels of containers in it as seen when each item went in (a container
  // grown after it was nested is not re-counted: nothing walks values
  // recursively, so the bound only has to stop the plain deep file).
  int depth = 1;
};

class Machine {
 public:
  Machine(const std::string& pkl, const std::string& file) : p_(pkl), file_(file) {}
  Ref run();

 private:
  Ref make(Value::Kind k) {
    arena_.emplace_back();
    arena_.back().kind = k;
    return &arena_.back();
  }
  // `outer` now holds `inner`: refused past kMaxDepth levels.
  void nest(Ref outer, Ref inner) {
    if (inner->depth + 1 > outer->depth) outer->depth = inner->depth + 1;
    if (outer->depth > kMaxDepth)
      fail("nests values more than " + std::to_string(kMaxDepth) + " levels deep; a state dict does not");
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("torch.save file '" + file_ + "': data.pkl " + what);
  }
  const unsigned char* take(size_t n) {
    if (n > p_.size() - at_) fail("is truncated");
    const auto* b = reinterpret_cast<const unsigned char*>(p_.data()) + at_;
    at_ += n;
    return b;
  }
  uint64_t le(size_t n) {
    const unsigned char* b = take(n);
    uint64_t v = 0;
    for (size_t k = n; k-- > 0;) v = (v << 8) | b[k];
    return v;
  }
  std::string line() {
    const size_t nl = p_.find('\n', at_);
    if (nl == std::string::npos) fail("is truncated");
    std::string s = p_.substr(at_, nl - at_);
    at_ = nl + 1;
    return s;
  }
  Ref pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("is malformed (stack underflow)");
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<Ref> pop_mark() {
    if (marks_.empty()) fail("is malformed (no mark)");
    std::vector<Ref> out(stack_.begin() + static_cast<long>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return out;
  }
  Ref& top() {
    if (stack_.empty()) fail("is malformed (empty stack)");
    return stack_.back();
  }
  Ref str(std::string s) {
    Ref v = make(Value::Str);
    v->s = std::move(s);
    return v;
  }
  Ref integer(int64_t i) {
    Ref v = make(Value::Int);
    v->i = i;
    return v;
  }
  Ref tuple(std::vector<Ref> items) {
    Ref v = make(Value::Tuple);
    for (Ref i : items) nest(v, i);
    v->items = std::move(items);
    return v;
  }
  void append(Ref list, Ref v) {
    nest(list, v);
    list->items.push_back(v);
  }
  void set_items(Ref d, const std::vector<Ref>& kv);
  Ref reduce(const Ref& callable, const Ref& args);
  Ref persistent(const Ref& pid);
  bool step(unsigned char op);

  const std::string& p_;
  std::string file_;
  size_t at_ = 0;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Ref> memo_;
  std::deque<Value> arena_;  // every value; a deque never moves them
};

void Machine::set_items(Ref d, const std::vector<Ref>& kv) {
  if (d->kind != Value::Dict) fail("sets items on something that is not a dict");
  for (size_t k = 0; k + 1 < kv.size(); k += 2) {
    nest(d, kv[k]);
    nest(d, kv[k + 1]);
    d->dict.emplace_back(kv[k], kv[k + 1]);
  }
}

std::vector<int64_t> ints(const Ref& t, const char* what, const std::string& file) {
  std::vector<int64_t> out;
  if (t->kind != Value::Tuple) throw Error("torch.save file '" + file + "': a tensor's " + what + " is not a tuple");
  for (const auto& v : t->items) {
    if (v->kind != Value::Int) throw Error("torch.save file '" + file + "': a tensor's " + what + " is not integers");
    out.push_back(v->i);
  }
  return out;
}

Ref Machine::reduce(const Ref& callable, const Ref& args) {
  const std::string g = callable->kind == Value::Global ? callable->s : "?";
  if (g == "collections.OrderedDict" || g == "builtins.dict") return make(Value::Dict);
  if (args->kind != Value::Tuple) fail("calls " + g + " without a tuple");
  const auto& a = args->items;
  if ((g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor") && a.size() >= 4 &&
      a[0]->kind == Value::Storage && a[1]->kind == Value::Int) {
    Ref t = make(Value::Tensor);
    t->tensor.storage_key = a[0]->s;
    t->tensor.storage_type = a[0]->storage_type;
    t->tensor.storage_offset = a[1]->i;
    t->tensor.shape = ints(a[2], "size", file_);
    t->tensor.strides = ints(a[3], "stride", file_);
    if (t->tensor.shape.size() != t->tensor.strides.size()) fail("has a tensor whose size and stride differ in length");
    return t;
  }
  if (g == "torch._utils._rebuild_parameter" && !a.empty() && a[0]->kind == Value::Tensor) return a[0];
  // libtorch's own pickler (torch::pickle_save) tags typed containers.
  if (g == "torch.jit._pickle.restore_type_tag" && !a.empty()) return a[0];
  fail("builds an object with " + g + " (a whole model, or a TorchScript module?), not a state dict of tensors; "
       "save model.state_dict()");
}

Ref Machine::persistent(const Ref& pid) {
  if (pid->kind != Value::Tuple || pid->items.size() < 3 || pid->items[0]->kind != Value::Str ||
      pid->items[0]->s != "storage" || pid->items[1]->kind != Value::Global || pid->items[2]->kind != Value::Str)
    fail("has a persistent id that is not a storage");
  Ref s = make(Value::Storage);
  const std::string& type = pid->items[1]->s;
  s->storage_type = type.substr(type.rfind('.') + 1);
  s->s = pid->items[2]->s;
  return s;
}

// One opcode; false at STOP.
bool Machine::step(unsigned char op) {
  switch (op) {
    case 0x80: take(1); break;                                   // PROTO
    case 0x95: take(8); break;                                   // FRAME
    case '.': return false;                                      // STOP
    case '(': marks_.push_back(stack_.size()); break;            // MARK
    case 'N': stack_.push_back(make(Value::None)); break;
    case 0x88: case 0x89: stack_.push_back(integer(op == 0x88)); stack_.back()->kind = Value::Bool; break;
    case 'K': stack_.push_back(integer(static_cast<int64_t>(le(1)))); break;                 // BININT1
    case 'M': stack_.push_back(integer(static_cast<int64_t>(le(2)))); break;                 // BININT2
    case 'J': stack_.push_back(integer(static_cast<int32_t>(le(4)))); break;                 // BININT
    case 0x8a: {                                                                             // LONG1
      const size_t n = static_cast<size_t>(le(1));
      if (n > 8) fail("has an integer over 64 bits");
      uint64_t v = n ? le(n) : 0;
      if (n && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
      stack_.push_back(integer(static_cast<int64_t>(v)));
      break;
    }
    case 'G': take(8); stack_.push_back(make(Value::Float)); break;                         // BINFLOAT
    case 'X': case 0x8c: case 'T': case 'U': case 'B': case 'C': case 0x8e: {                // strings, bytes
      const size_t n = static_cast<size_t>(op == 0x8c || op == 'U' || op == 'C' ? le(1) : op == 0x8e ? le(8) : le(4));
      stack_.push_back(str(std::string(reinterpret_cast<const char*>(take(n)), n)));
      break;
    }
    case 'c': {                                                                              // GLOBAL
      Ref g = make(Value::Global);
      g->s = line();
      g->s += "." + line();
      stack_.push_back(g);
      break;
    }
    case 0x93: {                                                                             // STACK_GLOBAL
      Ref name = pop(), module = pop();
      Ref g = make(Value::Global);
      g->s = module->s + "." + name->s;
      stack_.push_back(g);
      break;
    }
    case ')': stack_.push_back(tuple({})); break;
    case 't': stack_.push_back(tuple(pop_mark())); break;
    case 0x85: case 0x86: case 0x87: {                                                       // TUPLE1-3
      std::vector<Ref> items(static_cast<size_t>(op - 0x84));
      for (size_t k = items.size(); k-- > 0;) items[k] = pop();
      stack_.push_back(tuple(std::move(items)));
      break;
    }
    case '}': stack_.push_back(make(Value::Dict)); break;
    case ']': stack_.push_back(make(Value::List)); break;
    case 'l': { Ref l = make(Value::List); for (Ref v : pop_mark()) append(l, v); stack_.push_back(l); break; }
    case 'a': { Ref v = pop(); append(top(), v); break; }                                     // APPEND
    case 'e': { auto vs = pop_mark(); for (auto& v : vs) append(top(), v); break; }           // APPENDS
    case 's': { Ref v = pop(), k = pop(); set_items(top(), {k, v}); break; }                   // SETITEM
    case 'u': { auto kv = pop_mark(); set_items(top(), kv); break; }                           // SETITEMS
    case 'q': memo_[le(1)] = top(); break;                                                    // BINPUT
    case 'r': memo_[le(4)] = top(); break;                                                    // LONG_BINPUT
    case 0x94: memo_[memo_.size()] = top(); break;                                            // MEMOIZE
    case 'h': case 'j': {                                                                     // BINGET, LONG_BINGET
      auto it = memo_.find(le(op == 'h' ? 1 : 4));
      if (it == memo_.end()) fail("refers to a value it never stored");
      stack_.push_back(it->second);
      break;
    }
    case 'R': { Ref args = pop(), f = pop(); stack_.push_back(reduce(f, args)); break; }      // REDUCE
    case 'b': pop(); top(); break;  // BUILD: a state dict's _metadata is not needed
    case 'Q': { Ref pid = pop(); stack_.push_back(persistent(pid)); break; }                  // BINPERSID
    default: fail("has opcode 0x" + std::string(1, "0123456789abcdef"[op >> 4]) + "0123456789abcdef"[op & 15] +
                  ", which torch.save of a state dict does not write");
  }
  return true;
}

Ref Machine::run() {
  while (step(*take(1))) {}
  if (stack_.size() != 1) fail("is malformed (it leaves " + std::to_string(stack_.size()) + " values)");
  return stack_.back();
}

}  // namespace

std::vector<PickledTensor> read_pickled_state_dict(const std::string& pkl, const std::string& file) {
  Machine machine(pkl, file);  // owns every value `top` reaches
  const Ref top = machine.run();
  const std::string where = "torch.save file '" + file + "'";
  if (top->kind != Value::Dict) throw Error(where + " is not a state dict: it holds something other than a dict of tensors");
  std::vector<PickledTensor> out;
  for (const auto& kv : top->dict) {
    if (kv.first->kind != Value::Str) throw Error(where + " is a dict whose keys are not all names, not a state dict");
    if (kv.second->kind != Value::Tensor)
      throw Error(where + ": entry '" + kv.first->s + "' is not a tensor, so this is not a state dict");
    out.push_back(kv.second->tensor);
    out.back().name = kv.first->s;
  }
  return out;
}

}  // namespace shardplan::weights_detail
