// Every way a plugin can fail to load gets a one-line error naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "shardplan/error.h"
#include "shardplan/plugin_loader.h"

namespace test_plugin_loader {

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

// A name from a plan or --backend picks a file in a plugin directory; it is
// never a path, relative (the working directory) or absolute, even to a
// library that would load.
TEST(PluginLoader, NamesAreNeverPaths) {
  auto& loader = PluginLoader::instance();
  const std::string real = shardplan::default_plugin_dir() + "/libshardplan_comm_local.so";
  ASSERT_TRUE(std::filesystem::exists(real));
  for (const std::string name : {real, std::string("./libshardplan_comm_local.so"), std::string("../local"),
                                 std::string(".local"), std::string("")}) {
    try {
      loader.load(SP_PLUGIN_COMM, name);
      FAIL() << "loaded '" << name << "'";
    } catch (const shardplan::PluginError& e) {
      EXPECT_EQ(std::string(e.what()),
                "'" + name +
                    "' is not a comm plugin name (letters, digits, '_', '-', '.'): plugins are found by name in the "
                    "plugin directories, never by path; put the library's folder in SHARDPLAN_PLUGIN_PATH");
    }
  }
  EXPECT_THROW(loader.layer("/tmp/libshardplan_layer_dense.so"), shardplan::PluginError);
  EXPECT_THROW(loader.comm("sub/local"), shardplan::PluginError);
}

// A plan's plugins: folders are searched only with SHARDPLAN_PLAN_PLUGINS=1,
// and then must exist; errors point at the plan's entry.
TEST(PluginLoader, PlanDirectoriesNeedTheUsersOptIn) {
  auto& loader = PluginLoader::instance();
  const std::string dir = std::filesystem::weakly_canonical(::testing::TempDir()).string() + "/plan_plugins_" +
                          std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const shardplan::SourceLoc at{"p.yaml", 2, 11};
  auto error = [&](const std::vector<std::string>& dirs) -> std::string {
    try {
      loader.add_plan_dirs(dirs, {at});
    } catch (const shardplan::PlanError& e) {
      return e.what();
    }
    return "";
  };
  auto searched = [&] {
    auto path = loader.search_path();
    return std::find(path.begin(), path.end(), dir) != path.end();
  };
  unsetenv("SHARDPLAN_PLAN_PLUGINS");
  EXPECT_EQ(error({dir}), "p.yaml:2:11: the plan names plugin directory '" + dir +
                              "', which is searched only with SHARDPLAN_PLAN_PLUGINS=1 (plugins run code when "
                              "loaded; or add it to SHARDPLAN_PLUGIN_PATH)");
  setenv("SHARDPLAN_PLAN_PLUGINS", "yes", 1);  // only 1 opts in, and a typo is not a silent "no"
  EXPECT_EQ(error({dir}), "p.yaml:2:11: SHARDPLAN_PLAN_PLUGINS='yes' is not one of: 0, 1");
  setenv("SHARDPLAN_PLAN_PLUGINS", "0", 1);
  EXPECT_NE(error({dir}).find("searched only with SHARDPLAN_PLAN_PLUGINS=1"), std::string::npos);
  EXPECT_FALSE(searched());
  setenv("SHARDPLAN_PLAN_PLUGINS", "1", 1);
  EXPECT_EQ(error({dir + "/nothere"}),
            "p.yaml:2:11: plugin directory '" + dir + "/nothere' does not exist or is not a directory");
  EXPECT_FALSE(searched());
  EXPECT_EQ(error({dir}), "");
  EXPECT_TRUE(searched());
  unsetenv("SHARDPLAN_PLAN_PLUGINS");
  std::filesystem::remove_all(dir);
}

// A library whose static initialiser calls exit(0) must not end the program
// with status 0: the loader turns it into status 1 naming the library.
TEST(PluginLoaderDeathTest, ExitWhileLoadingIsAFailure) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the test binary has threads (torch's pools)
  const std::string p = kDir + "/libshardplan_comm_exits.so";
  EXPECT_EXIT(PluginLoader::instance().load_file(p, SP_PLUGIN_COMM), ::testing::ExitedWithCode(1),
              "shardplan: plugin " + p + " called exit\\(\\) while being loaded; the process fails with status 1");
}

}  // namespace

}  // namespace test_plugin_loader
