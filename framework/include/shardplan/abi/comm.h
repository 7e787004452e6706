/* Communication plugin ABI, version 1.
 *
 * Torch-free by design: buffers are (pointer, element count, dtype, device,
 * stream), so a backend such as NCCL needs no CUDA build of libtorch and a
 * benchmark can drive raw memory. The framework's tensor-level Communicator
 * (communicator.h) is the only caller inside shardplan.
 *
 * Conventions shared by every backend:
 *  - Every call returns an sp_status; on failure `last_error()` (per calling
 *    thread) holds a one-line message naming the collective.
 *  - `work == NULL` makes the call blocking. Otherwise the call only enqueues
 *    and stores a handle in *work that the caller must `release`. Operations
 *    on one communicator complete in the order they were issued, but for a
 *    blocking recv: it returns once its own message is in, whatever sends
 *    this rank issued before are still waiting for their peers (two ranks
 *    that send to each other and then receive must not wait on each other).
 *  - In-place is expressed by send->data == recv->data (where a collective
 *    allows it). Buffers of different dtype/device are invalid.
 *  - Rank-major layouts: all_gather writes rank r's contribution at
 *    [r*n, (r+1)*n) of recv; reduce_scatter gives rank r the reduction of
 *    send[r*n, (r+1)*n); scatter/gather/all_to_all likewise.
 *  - A communicator is used by one thread at a time (plus the backend's own
 *    worker threads). Ranks of the in-process backend are threads, each with
 *    its own communicator.
 */
#ifndef SHARDPLAN_ABI_COMM_H
#define SHARDPLAN_ABI_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SP_COMM_ABI_VERSION 1u

typedef enum sp_status {
  SP_OK = 0,
  SP_ERR_INVALID = 1,      /* bad arguments: counts, dtype, root, peer */
  SP_ERR_TIMEOUT = 2,      /* wait() ran out of time; the work stays valid */
  SP_ERR_UNSUPPORTED = 3,  /* dtype/op/device this backend cannot do */
  SP_ERR_INTERNAL = 4,     /* transport failure, peer vanished, ... */
  SP_ERR_ABORTED = 5       /* the communicator was aborted */
} sp_status;

typedef enum sp_dtype {
  SP_FLOAT32 = 0,
  SP_FLOAT64 = 1,
  SP_FLOAT16 = 2,
  SP_BFLOAT16 = 3,
  SP_INT8 = 4,
  SP_UINT8 = 5,
  SP_INT32 = 6,
  SP_INT64 = 7
} sp_dtype;

typedef enum sp_reduce_op { SP_SUM = 0, SP_MAX = 1, SP_MIN = 2, SP_PROD = 3 } sp_reduce_op;

typedef enum sp_device_type { SP_DEVICE_CPU = 0, SP_DEVICE_CUDA = 1 } sp_device_type;

typedef struct sp_buffer {
  void* data;
  uint64_t count;        /* elements, not bytes */
  int32_t dtype;         /* sp_dtype */
  int32_t device_type;   /* sp_device_type */
  int32_t device_index;
  void* stream;          /* cudaStream_t for CUDA buffers; NULL for CPU */
} sp_buffer;

/* Rendezvous key/value store provided by the host (the framework adapts
 * its own TCP store or c10d's FileStore to it). Values returned by get()
 * are allocated with malloc() and freed by the plugin with free(). */
typedef struct sp_store {
  void* ctx;
  int (*set)(void* ctx, const char* key, const void* data, size_t len);
  int (*get)(void* ctx, const char* key, void** data, size_t* len, int64_t timeout_ms);
  int (*check)(void* ctx, const char* key, int* exists);
  const char* (*last_error)(void* ctx);
} sp_store;

typedef struct sp_comm_config {
  uint32_t struct_size;        /* sizeof(sp_comm_config) of the caller */
  int32_t rank;
  int32_t world_size;
  int64_t timeout_ms;          /* every blocking step gives up after this */
  const sp_store* store;       /* may be NULL: then options must say how to meet */
  const char* const* options;  /* NULL-terminated "key=value" strings, backend specific */
} sp_comm_config;

typedef struct sp_comm sp_comm;
typedef struct sp_work sp_work;

#define SP_CAP_CPU 1u
#define SP_CAP_CUDA 2u
#define SP_CAP_THREAD_RANKS 4u   /* ranks may be threads of one process */
#define SP_CAP_PROCESS_RANKS 8u  /* ranks may be separate processes */

typedef struct sp_comm_api {
  uint32_t abi_version;   /* SP_COMM_ABI_VERSION */
  uint32_t struct_size;   /* sizeof(sp_comm_api) the plugin was built with */
  const char* name;
  uint32_t caps;          /* SP_CAP_* */

  const char* (*last_error)(void);

  int (*create)(const sp_comm_config* config, sp_comm** out);
  /* Collective over `parent`, like MPI_Comm_split: ranks with equal color form
   * a communicator ordered by (key, parent rank). color < 0 yields *out = NULL. */
  int (*split)(sp_comm* parent, int32_t color, int32_t key, sp_comm** out);
  /* Makes pending and future operations of this communicator (and of the
   * ranks sharing its group, where the backend can reach them) fail with
   * SP_ERR_ABORTED instead of waiting for a peer that will never come. */
  int (*abort)(sp_comm* comm);
  void (*destroy)(sp_comm* comm);
  int32_t (*rank)(const sp_comm* comm);
  int32_t (*size)(const sp_comm* comm);

  int (*all_reduce)(sp_comm*, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work);
  int (*all_gather)(sp_comm*, const sp_buffer* send, const sp_buffer* recv, sp_work** work);
  int (*reduce_scatter)(sp_comm*, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work);
  /* broadcast: root sends `send`, every rank receives into `recv` (the root
   * too, unless in-place). */
  int (*broadcast)(sp_comm*, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work);
  /* scatter: `send` (count = recv.count * size) is read at root only. */
  int (*scatter)(sp_comm*, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work);
  /* gather: `recv` (count = send.count * size) is written at root only. */
  int (*gather)(sp_comm*, const sp_buffer* send, const sp_buffer* recv, int32_t root, sp_work** work);
  /* all_to_all: send.count == recv.count, divisible by size; block j of send
   * goes to rank j and lands as block r (this rank) of its recv. */
  int (*all_to_all)(sp_comm*, const sp_buffer* send, const sp_buffer* recv, sp_work** work);
  int (*send)(sp_comm*, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work);
  int (*recv)(sp_comm*, const sp_buffer* buf, int32_t peer, int32_t tag, sp_work** work);
  int (*barrier)(sp_comm*, sp_work** work);

  /* SP_ERR_TIMEOUT when not finished in time (timeout_ms < 0: wait forever,
   * bounded by the communicator's own timeout). */
  int (*wait)(sp_work* work, int64_t timeout_ms);
  int (*test)(sp_work* work, int32_t* done);
  /* Frees the handle; an unfinished operation still completes. */
  void (*release)(sp_work* work);
} sp_comm_api;

#ifdef __cplusplus
}
#endif

#endif /* SHARDPLAN_ABI_COMM_H */
