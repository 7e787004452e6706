#include "cuda.h"

#include <dlfcn.h>

#include <stdexcept>

namespace shardplan_bench {

namespace {
// cudaMemcpyKind and cudaStreamNonBlocking, stable across CUDA releases.
constexpr int kHostToDevice = 1;
constexpr int kDeviceToHost = 2;
constexpr unsigned kStreamNonBlocking = 1;

template <class F>
bool bind(void* lib, const char* name, F** fn) {
  *fn = reinterpret_cast<F*>(::dlsym(lib, name));
  return *fn != nullptr;
}
}  // namespace

const Cuda* Cuda::get() {
  static const Cuda* instance = []() -> const Cuda* {
    void* lib = nullptr;
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"})
      if ((lib = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL))) break;
    if (!lib) return nullptr;
    auto* c = new Cuda();
    bool ok = bind(lib, "cudaGetDeviceCount", &c->get_device_count_) && bind(lib, "cudaSetDevice", &c->set_device_) &&
              bind(lib, "cudaMalloc", &c->malloc_) && bind(lib, "cudaFree", &c->free_) &&
              bind(lib, "cudaMemcpy", &c->memcpy_) && bind(lib, "cudaMemset", &c->memset_) &&
              bind(lib, "cudaStreamCreateWithFlags", &c->stream_create_) &&
              bind(lib, "cudaStreamDestroy", &c->stream_destroy_) &&
              bind(lib, "cudaStreamSynchronize", &c->stream_synchronize_) &&
              bind(lib, "cudaGetErrorString", &c->error_string_);
    if (!ok) {
      delete c;
      return nullptr;
    }
    return c;
  }();
  return instance;
}

void Cuda::check(int err, const char* what) const {
  if (err != 0) throw std::runtime_error(std::string(what) + ": " + error_string_(err));
}

int Cuda::device_count() const {
  int n = 0;
  return get_device_count_(&n) == 0 ? n : 0;
}
void Cuda::set_device(int d) const { check(set_device_(d), "cudaSetDevice"); }
void* Cuda::malloc(size_t bytes) const {
  void* p = nullptr;
  check(malloc_(&p, bytes ? bytes : 1), "cudaMalloc");
  check(memset_(p, 0, bytes), "cudaMemset");
  return p;
}
void Cuda::free(void* p) const {
  if (p) free_(p);
}
void Cuda::to_device(void* dst, const void* src, size_t bytes) const {
  check(memcpy_(dst, src, bytes, kHostToDevice), "cudaMemcpy to the device");
}
void Cuda::to_host(void* dst, const void* src, size_t bytes) const {
  check(memcpy_(dst, src, bytes, kDeviceToHost), "cudaMemcpy to the host");
}
void* Cuda::create_stream() const {
  void* s = nullptr;
  check(stream_create_(&s, kStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}
void Cuda::destroy_stream(void* s) const {
  if (s) stream_destroy_(s);
}
void Cuda::synchronize(void* s) const { check(stream_synchronize_(s), "cudaStreamSynchronize"); }

}  // namespace shardplan_bench
