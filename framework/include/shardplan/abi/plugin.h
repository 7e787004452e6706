/* The one entry point every shardplan plugin exports.
 *
 * Like an LLVM pass plugin, a plugin library exports exactly one C symbol,
 * `shardplan_plugin_entry`, returning a static description of itself. The
 * loader checks `entry_version` (the layout of this struct) and then
 * `abi_version` against the ABI of the plugin's kind before touching
 * `factory`, so an old or foreign library is refused instead of crashing.
 *
 * This header is plain C on purpose: a communication plugin (NCCL, MPI) must be
 * buildable without libtorch. */
#ifndef SHARDPLAN_ABI_PLUGIN_H
#define SHARDPLAN_ABI_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SP_PLUGIN_ENTRY_SYMBOL "shardplan_plugin_entry"
#define SP_PLUGIN_ENTRY_VERSION 1u

typedef enum sp_plugin_kind {
  SP_PLUGIN_COMM = 1,  /* factory returns `const sp_comm_api*` (abi/comm.h) */
  SP_PLUGIN_LAYER = 2  /* factory returns `shardplan::LayerPlugin*` (layer_plugin.h) */
} sp_plugin_kind;

typedef struct sp_plugin_info {
  uint32_t entry_version;      /* SP_PLUGIN_ENTRY_VERSION */
  uint32_t kind;               /* sp_plugin_kind */
  uint32_t abi_version;        /* SP_COMM_ABI_VERSION or SHARDPLAN_LAYER_ABI_VERSION */
  const char* name;            /* "gloo", "dense", ... : what plans and --backend say */
  const char* plugin_version;  /* free text, shown in reports */
  const void* (*factory)(void);
} sp_plugin_info;

typedef const sp_plugin_info* (*sp_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

/* Visibility for the entry point; plugins are built with hidden visibility. */
#if defined(__GNUC__)
#define SP_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define SP_PLUGIN_EXPORT
#endif

#endif /* SHARDPLAN_ABI_PLUGIN_H */
