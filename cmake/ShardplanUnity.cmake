# Unity builds of the libtorch targets. Every translation unit that links
# libtorch loads the precompiled <torch/torch.h> (cmake/ShardplanPch.cmake),
# and loading it takes about 6 s however small the file is (an empty file:
# 6 s); it also instantiates libtorch's and gtest's inline templates again.
# Joining a target's files into batches pays both once per batch. After the
# whole tree is defined, shardplan_unity_torch_targets() gives this to every
# target that links libtorch and has more than one source, so a new target
# needs nothing.
#
# Joined files share one translation unit, so their file-local names must not
# meet: a test file wraps itself in a namespace named after the file
# (tests/CMakeLists.txt), a library file names its helpers apart. A clash is a
# compile error, not a silent change. -DSHARDPLAN_UNITY=OFF compiles file by
# file (quicker to rebuild after touching one file; it also shows a missing
# #include that a neighbour in the batch hides).
option(SHARDPLAN_UNITY "join each libtorch target's files into unity batches" ON)
set(SHARDPLAN_UNITY_BATCH 8 CACHE STRING "files per unity batch")

function(shardplan_unity_torch_targets)
  if(NOT SHARDPLAN_UNITY)
    return()
  endif()
  _shardplan_torch_targets(targets)
  foreach(t IN LISTS targets)
    get_target_property(sources ${t} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.(cpp|cc|cxx)$")
    list(LENGTH sources n)
    if(n LESS 2)
      continue()
    endif()
    set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${SHARDPLAN_UNITY_BATCH})
    # GCC warns when a type with a file-local member or base is declared
    # in an included file, as a header would do it; joined files are
    # included files, so the warning says nothing about them.
    target_compile_options(${t} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
  endforeach()
endfunction()
