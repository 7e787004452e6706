/* Deliberately broken plugins for the loader's tests; one per failure mode,
 * selected at compile time with BAD_KIND. */
#include "shardplan/abi/comm.h"
#include "shardplan/abi/plugin.h"

#if BAD_KIND != 0 /* 0: a library with no entry point at all */
static const void* factory(void) { return 0; }

SP_PLUGIN_EXPORT const sp_plugin_info* shardplan_plugin_entry(void) {
  static const sp_plugin_info info = {
#if BAD_KIND == 1 /* an entry layout from the future */
      SP_PLUGIN_ENTRY_VERSION + 1, SP_PLUGIN_COMM, SP_COMM_ABI_VERSION,
#elif BAD_KIND == 2 /* a comm plugin built against another comm ABI */
      SP_PLUGIN_ENTRY_VERSION, SP_PLUGIN_COMM, SP_COMM_ABI_VERSION + 41,
#elif BAD_KIND == 3 /* a layer plugin where a comm plugin is expected */
      SP_PLUGIN_ENTRY_VERSION, SP_PLUGIN_LAYER, 1u,
#else /* 4: a layer plugin built against a layer ABI no shardplan has */
      SP_PLUGIN_ENTRY_VERSION, SP_PLUGIN_LAYER, 999u,
#endif
      "bad", "0", factory};
  return &info;
}
#else
int shardplan_not_a_plugin(void) { return 42; }
#endif
