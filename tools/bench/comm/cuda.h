#pragma once
// The few CUDA runtime calls the bench needs for GPU buffers (allocate, copy,
// synchronize a stream), looked up with dlopen at run time: the bench builds
// without a CUDA toolkit and runs on machines without a GPU, and a backend
// that needs one (NCCL) is simply "unavailable" there.
#include <cstddef>
#include <string>

namespace shardplan_bench {

class Cuda {
 public:
  // nullptr when no CUDA runtime library can be loaded.
  static const Cuda* get();

  int device_count() const;  // 0 on any error (no driver, no device)
  // Each throws std::runtime_error with CUDA's message on failure.
  void set_device(int device) const;
  void* malloc(size_t bytes) const;
  void free(void* p) const;
  void to_device(void* dst, const void* src, size_t bytes) const;
  void to_host(void* dst, const void* src, size_t bytes) const;
  void* create_stream() const;
  void destroy_stream(void* stream) const;
  void synchronize(void* stream) const;

 private:
  Cuda() = default;
  void check(int err, const char* what) const;

  int (*get_device_count_)(int*) = nullptr;
  int (*set_device_)(int) = nullptr;
  int (*malloc_)(void**, size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*memcpy_)(void*, const void*, size_t, int) = nullptr;
  int (*memset_)(void*, int, size_t) = nullptr;
  int (*stream_create_)(void**, unsigned) = nullptr;
  int (*stream_destroy_)(void*) = nullptr;
  int (*stream_synchronize_)(void*) = nullptr;
  const char* (*error_string_)(int) = nullptr;
};

}  // namespace shardplan_bench
