/* A comm plugin whose static initialiser ends the process with status 0, as
 * a library that "handles" a problem by exiting might: loading it must not
 * make the run look successful (tests/test_plugin_loader.cpp,
 * faults.plugin_exits_on_load). */
#include <stdlib.h>

#include "shardplan/abi/plugin.h"

__attribute__((constructor)) static void leave(void) { exit(0); }

static const void* factory(void) { return 0; }

SP_PLUGIN_EXPORT const sp_plugin_info* shardplan_plugin_entry(void) {
  static const sp_plugin_info info = {SP_PLUGIN_ENTRY_VERSION, SP_PLUGIN_COMM, 1u, "exits", "0", factory};
  return &info;
}
