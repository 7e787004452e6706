// The translation unit a precompiled-header donor target needs to exist
// (cmake/ShardplanPch.cmake); it compiles to nothing.
