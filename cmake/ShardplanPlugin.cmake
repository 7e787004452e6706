# shardplan_add_plugin(<kind> <name> SOURCES ... [LIBS ...])
#   kind: comm | layer. Produces lib/shardplan/plugins/libshardplan_<kind>_<name>.so,
#   the file name the loader looks for. Layer plugins link the framework (and so
#   libtorch); comm plugins get only the C ABI headers and stay torch-free.
function(shardplan_add_plugin kind name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  set(target shardplan_${kind}_${name})
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${SHARDPLAN_PLUGIN_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN/../..")
  if(kind STREQUAL "layer")
    target_link_libraries(${target} PRIVATE shardplan::shardplan ${P_LIBS})
  else()
    target_link_libraries(${target} PRIVATE shardplan::abi ${P_LIBS})
    # Their reduction and conversion loops must vectorize fully (the build
    # type's -O2 leaves some scalar); torch-free, they compile in seconds.
    target_compile_options(${target} PRIVATE -O3)
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION ${SHARDPLAN_PLUGIN_SUBDIR})
  set_property(GLOBAL APPEND PROPERTY SHARDPLAN_PLUGINS ${target})
endfunction()
