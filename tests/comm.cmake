# Communication backend tests: the torch-free conformance library, the
# comm_conformance runner and its ctest cases live in comm/; the unit-test
# binary gets the library for test_comm.cpp.
add_subdirectory(${CMAKE_CURRENT_LIST_DIR}/comm ${CMAKE_CURRENT_BINARY_DIR}/comm)
target_link_libraries(shardplan_tests PRIVATE shardplan_comm_conformance)
