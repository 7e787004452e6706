# Precompiled libtorch headers. Parsing <torch/torch.h> and what it pulls in
# is most of the ~13 s a libtorch translation unit takes; GCC loads it
# precompiled instead. A precompiled header is valid only for the
# code-generation flags it was made with (GCC refuses one made with -fPIC in a
# -fPIE compile), so there is one donor per kind of target: libraries (-fPIC)
# and executables (-fPIE, GCC's default here). Making one costs about as much
# as eight translation units and loading it ~5 s of the ~13 s it saves, so the
# layer plugins (one file each, built with hidden visibility, which a header
# parsed without it would not give) parse libtorch themselves. After the whole
# tree is defined, shardplan_precompile_torch() gives every other target that
# links libtorch, directly or through our libraries, the header of its kind: a
# new target needs nothing. -DSHARDPLAN_PCH=OFF builds without (it shows a missing
# #include that the precompiled header hides).
option(SHARDPLAN_PCH "precompile libtorch's headers" ON)

if(SHARDPLAN_PCH)
  # A header used with other flags is silently parsed from source instead:
  # make that visible.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch>)
endif()

function(_shardplan_pch_donor name)
  add_library(${name} OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch/donor.cpp)
  target_link_libraries(${name} PRIVATE torch)
  target_precompile_headers(${name} PRIVATE <torch/torch.h>)
  set_target_properties(${name} PROPERTIES ${ARGN})
endfunction()

# Whether a target links libtorch, directly or through targets of this tree.
function(_shardplan_links_torch target out)
  set(${out} FALSE PARENT_SCOPE)
  get_target_property(aliased ${target} ALIASED_TARGET)
  if(aliased)
    set(target ${aliased})
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    get_target_property(libs ${target} INTERFACE_LINK_LIBRARIES)
  else()
    get_target_property(libs ${target} LINK_LIBRARIES)
  endif()
  foreach(lib IN LISTS libs)
    if(lib STREQUAL "torch" OR lib MATCHES "libtorch")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    if(TARGET ${lib})
      get_target_property(imported ${lib} IMPORTED)
      if(NOT imported)
        _shardplan_links_torch(${lib} found)
        if(found)
          set(${out} TRUE PARENT_SCOPE)
          return()
        endif()
      endif()
    endif()
  endforeach()
endfunction()

function(_shardplan_targets_in dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _shardplan_targets_in(${sub} more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The targets of this tree that compile code and link libtorch (the
# precompiled-header donors left out): what the precompiled header and the
# unity build (cmake/ShardplanUnity.cmake) are given to.
function(_shardplan_torch_targets out)
  _shardplan_targets_in(${PROJECT_SOURCE_DIR} targets)
  set(found "")
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(t MATCHES "^shardplan_pch_" OR NOT type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|STATIC_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    _shardplan_links_torch(${t} uses_torch)
    if(uses_torch)
      list(APPEND found ${t})
    endif()
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

function(shardplan_precompile_torch)
  if(NOT SHARDPLAN_PCH)
    return()
  endif()
  _shardplan_pch_donor(shardplan_pch_library POSITION_INDEPENDENT_CODE ON)
  _shardplan_pch_donor(shardplan_pch_executable POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(shardplan_pch_executable PRIVATE -fPIE)
  _shardplan_torch_targets(targets)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      set(donor shardplan_pch_executable)
    else()
      set(donor shardplan_pch_library)
    endif()
    target_precompile_headers(${t} REUSE_FROM ${donor})
  endforeach()
endfunction()
