# RE2 (plan patterns and weight renames, framework/src/base/ecma_regex.h) as
# the target shardplan::re2. Builds of RE2 with CMake install a config
# (re2::re2); Debian's libre2-dev installs only a pkg-config file.
if(TARGET shardplan::re2)
  return()
endif()
find_package(re2 CONFIG QUIET)
if(TARGET re2::re2)
  add_library(shardplan::re2 ALIAS re2::re2)
else()
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(SHARDPLAN_RE2 REQUIRED IMPORTED_TARGET re2)
  # Its Cflags' -pthread defines _REENTRANT, which would make every target
  # linking it refuse the precompiled header (cmake/ShardplanPch.cmake);
  # threads come with the link flags.
  set_property(TARGET PkgConfig::SHARDPLAN_RE2 PROPERTY INTERFACE_COMPILE_OPTIONS "")
  add_library(shardplan::re2 ALIAS PkgConfig::SHARDPLAN_RE2)
endif()
