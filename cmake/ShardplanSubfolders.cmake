# Adds every immediate sub-folder of the current source dir that has a
# CMakeLists.txt: plugins, tools, examples and benchmarks are one folder each.
macro(shardplan_add_subfolders)
  file(GLOB _sp_dirs LIST_DIRECTORIES true ${CMAKE_CURRENT_SOURCE_DIR}/*)
  foreach(_sp_dir ${_sp_dirs})
    if(IS_DIRECTORY ${_sp_dir} AND EXISTS ${_sp_dir}/CMakeLists.txt)
      add_subdirectory(${_sp_dir})
    endif()
  endforeach()
endmacro()
