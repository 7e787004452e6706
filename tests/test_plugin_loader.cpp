// Every way a plugin can fail to load gets a one-line error naming the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "shardplan/error.h"
#include "shardplan/plugin_loader.h"

namespace {

using shardplan::PluginLoader;

const std::string kDir = SHARDPLAN_TEST_PLUGIN_DIR;

std::string load_error(const std::string& path, sp_plugin_kind kind = SP_PLUGIN_COMM) {
  try {
    PluginLoader::instance().load_file(path, kind);
  } catch (const shardplan::PluginError& e) {
    return e.what();
  }
  return "";
}

void expect_one_line_naming(const std::string& msg, const std::string& path, const std::string& what) {
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
}

TEST(PluginLoader, MissingFile) {
  std::string p = kDir + "/libshardplan_comm_nothere.so";
  expect_one_line_naming(load_error(p), p, "does not exist");
}

TEST(PluginLoader, NotALibrary) {
  std::string p = std::filesystem::weakly_canonical(::testing::TempDir()).string() + "/libshardplan_comm_garbage.so";
  std::ofstream(p) << "not an ELF file";
  expect_one_line_naming(load_error(p), p, "cannot load plugin");
  std::filesystem::remove(p);
}

TEST(PluginLoader, MissingEntryPoint) {
  std::string p = kDir + "/libshardplan_comm_noentry.so";
  expect_one_line_naming(load_error(p), p, "no 'shardplan_plugin_entry' entry point");
}

TEST(PluginLoader, EntryVersionMismatch) {
  std::string p = kDir + "/libshardplan_comm_entryversion.so";
  expect_one_line_naming(load_error(p), p, "plugin entry version 2, this shardplan expects 1");
}

TEST(PluginLoader, AbiVersionMismatch) {
  std::string p = kDir + "/libshardplan_comm_abiversion.so";
  expect_one_line_naming(load_error(p), p, "comm plugin ABI version 42, this shardplan expects 1");
}

TEST(PluginLoader, WrongKind) {
  std::string p = kDir + "/libshardplan_comm_wrongkind.so";
  expect_one_line_naming(load_error(p), p, "is a layer plugin, expected a comm plugin");
}

TEST(PluginLoader, UnknownNameListsTheSearchPath) {
  try {
    PluginLoader::instance().load(SP_PLUGIN_COMM, "nosuchbackend");
    FAIL() << "loaded a plugin that does not exist";
  } catch (const shardplan::PluginError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("no comm plugin 'nosuchbackend'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(shardplan::default_plugin_dir()), std::string::npos) << msg;
  }
}

TEST(PluginLoader, FindsBuiltPluginsNextToTheLibraryAndKeepsThemLoaded) {
  auto& loader = PluginLoader::instance();
  const sp_comm_api* a = loader.comm("local");
  const sp_comm_api* b = loader.comm("local");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a, b);
  EXPECT_STREQ(a->name, "local");
  EXPECT_EQ(a->abi_version, SP_COMM_ABI_VERSION);
  auto& p = loader.load(SP_PLUGIN_LAYER, "dense");
  EXPECT_EQ(p.path, shardplan::default_plugin_dir() + "/libshardplan_layer_dense.so");
}

TEST(PluginLoader, EnvironmentPathIsSearchedBeforeTheInstallDir) {
  setenv("SHARDPLAN_PLUGIN_PATH", (kDir + ":/nonexistent").c_str(), 1);
  auto path = PluginLoader::instance().search_path();
  unsetenv("SHARDPLAN_PLUGIN_PATH");
  ASSERT_GE(path.size(), 3u);
  auto it = std::find(path.begin(), path.end(), kDir);
  ASSERT_NE(it, path.end());
  EXPECT_LT(it - path.begin(), static_cast<long>(path.size()) - 1);
  EXPECT_EQ(path.back(), shardplan::default_plugin_dir());
}

}  // namespace
