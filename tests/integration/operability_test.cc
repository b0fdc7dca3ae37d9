// What an operator meets first, on every shipped binary:
// - `--help` lists each flag the binary parses (read from the ABSL_FLAG declarations in its
//   source files, and ferry-kv's own parser) with its type, default and a description, and
//   nothing else; the logging flags every binary shares come with it.
// - `--version` prints the version (the repository's VERSION file), the git commit and the build
//   configuration, the same commit in every binary.
// - A bad flag or --log_format value exits non-zero naming it.
// - `--log_format=json` makes every stderr line of the services (the KV store, the three worker
//   roles, the router) one JSON object, and the router's lines about a request carry the trace id
//   the client sent as x-request-id.
// - Every service's /metrics passes `promtool check metrics`.
//
// Paths are relative to the test's runfiles directory (Bazel's working directory for a test).

#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

struct Binary {
  std::string name;
  std::string path;                  // relative to the runfiles directory
  std::vector<std::string> sources;  // the files whose ABSL_FLAGs it parses
};

const char kCommonFlags[] = "services/common/command_line.cc";

const std::vector<Binary>& AbslBinaries() {
  static const auto* binaries = new std::vector<Binary>{
      {"ferry-kvstore", "kvstore/service/ferry-kvstore", {"kvstore/service/kvstore_main.cc"}},
      {"ferry-worker", "services/worker/ferry-worker", {"services/worker/worker_main.cc"}},
      {"ferry-prefill", "services/worker/ferry-prefill", {"services/worker/worker_main.cc"}},
      {"ferry-decode", "services/worker/ferry-decode", {"services/worker/worker_main.cc"}},
      {"ferry-router", "router/ferry-router", {"router/router_main.cc"}},
      {"ferry-worker-cli",
       "tools/worker_cli/ferry-worker-cli",
       {"tools/worker_cli/worker_cli_main.cc"}},
      {"ferry-load",
       "tools/load/ferry-load",
       {"tools/load/load_main.cc", "tools/load/workload_flags.cc"}},
      {"ferry-sim",
       "tools/sim/ferry-sim",
       {"tools/sim/sim_main.cc", "tools/load/workload_flags.cc"}},
      {"ferry-calibrate", "tools/calibrate/ferry-calibrate", {"tools/calibrate/calibrate_main.cc"}},
  };
  return *binaries;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `command` (a shell command line) with stdout and stderr captured.
CommandResult RunCommand(const std::string& command) {
  static int n = 0;
  const std::string base = absl::StrCat(std::getenv("TEST_TMPDIR"), "/run", ++n);
  const int status =
      std::system(absl::StrCat(command, " > ", base, ".out 2> ", base, ".err < /dev/null").c_str());
  CommandResult run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = ReadFile(base + ".out");
  run.err = ReadFile(base + ".err");
  return run;
}

// What ABSL_FLAG(type, name, ...) declares in `source`: name -> the type as --help names it.
std::map<std::string, std::string> DeclaredFlags(const std::string& source) {
  static const std::map<std::string, std::string> kTypeNames = {
      {"bool", "bool"},
      {"int", "int"},
      {"int64_t", "int64"},
      {"uint64_t", "uint64"},
      {"double", "double"},
      {"std::string", "string"},
      {"absl::Duration", "duration"},
      {"std::vector<std::string>", "list"}};
  const std::string text = ReadFile(source);
  EXPECT_FALSE(text.empty()) << source << " is missing from the test's data";
  std::map<std::string, std::string> flags;
  const std::regex declaration(R"(ABSL_FLAG\(\s*([\w:<>]+)\s*,\s*(\w+)\s*,)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), declaration);
       it != std::sregex_iterator(); ++it) {
    const std::string type = (*it)[1];
    auto known = kTypeNames.find(type);
    EXPECT_NE(known, kTypeNames.end()) << source << ": flag " << (*it)[2] << " of type " << type;
    flags[(*it)[2]] = known == kTypeNames.end() ? "?" : known->second;
  }
  return flags;
}

struct Listed {
  std::string type, default_value, description;
};

// The flags a --help text lists: "  --name (TYPE, default VALUE)" then "      description" lines.
std::map<std::string, Listed> ListedFlags(const std::string& help) {
  std::map<std::string, Listed> listed;
  const std::regex head(R"(  --([\w-]+) \((\w+), default (.*)\))");
  std::vector<std::string> lines = absl::StrSplit(help, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    if (!std::regex_match(lines[i], m, head)) continue;
    Listed flag{m[2], m[3], ""};
    while (i + 1 < lines.size() && absl::StartsWith(lines[i + 1], "      ")) {
      absl::StrAppend(&flag.description, flag.description.empty() ? "" : " ",
                      absl::StripLeadingAsciiWhitespace(lines[++i]));
    }
    listed[m[1]] = flag;
  }
  return listed;
}

TEST(HelpTest, EveryBinaryListsEveryFlagItParsesWithTypeDefaultAndDescription) {
  const auto common = DeclaredFlags(kCommonFlags);
  ASSERT_EQ(common.count("log_format"), 1u);
  for (const Binary& binary : AbslBinaries()) {
    SCOPED_TRACE(binary.name);
    std::map<std::string, std::string> declared = common;
    for (const std::string& source : binary.sources) {
      for (const auto& [name, type] : DeclaredFlags(source)) declared[name] = type;
    }
    for (const char* help : {"--help", "-h", "--helpfull"}) {
      const CommandResult run = RunCommand(absl::StrCat(binary.path, " ", help));
      ASSERT_EQ(run.exit_code, 0) << help << ": " << run.err;
      EXPECT_TRUE(absl::StartsWith(run.out, binary.name + ": ")) << run.out.substr(0, 200);
      const auto listed = ListedFlags(run.out);
      for (const auto& [name, type] : declared) {
        auto it = listed.find(name);
        if (it == listed.end()) {
          ADD_FAILURE() << help << " does not list --" << name;
          continue;
        }
        EXPECT_EQ(it->second.type, type) << "--" << name;
        EXPECT_FALSE(it->second.description.empty()) << "--" << name;
        if (type == "string" || type == "list") {
          EXPECT_TRUE(absl::StartsWith(it->second.default_value, "\"")) << "--" << name;
        } else {
          EXPECT_FALSE(it->second.default_value.empty()) << "--" << name;
        }
      }
      // Nothing else: absl's own flags and other binaries' are not the binary's.
      for (const auto& [name, flag] : listed) {
        EXPECT_EQ(declared.count(name), 1u) << help << " lists --" << name << ", not declared";
      }
    }
  }
}

TEST(HelpTest, FerryKvListsEveryFlagItsParserTakes) {
  const std::string source = ReadFile("kvstore/tool/kv_tool.cc");
  ASSERT_FALSE(source.empty());
  std::set<std::string> parsed;
  const std::regex compared(R"re(arg == "--([\w-]+)")re");
  for (auto it = std::sregex_iterator(source.begin(), source.end(), compared);
       it != std::sregex_iterator(); ++it) {
    if ((*it)[1] != "help" && (*it)[1] != "version") parsed.insert((*it)[1]);
  }
  ASSERT_GE(parsed.size(), 7u);  // addr, json, capacity, segment-bytes, 3 TTLs, log_format
  const CommandResult run = RunCommand("kvstore/tool/ferry-kv --help");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto listed = ListedFlags(run.out);
  for (const std::string& name : parsed) {
    auto it = listed.find(name);
    ASSERT_NE(it, listed.end()) << "--" << name << " is not listed:\n" << run.out;
    EXPECT_FALSE(it->second.description.empty()) << name;
    EXPECT_FALSE(it->second.default_value.empty()) << name;
  }
  for (const auto& [name, flag] : listed) EXPECT_EQ(parsed.count(name), 1u) << name;
}

TEST(VersionTest, EveryBinaryPrintsTheVersionTheCommitAndTheBuild) {
  const std::string version(absl::StripAsciiWhitespace(ReadFile("VERSION")));
  ASSERT_FALSE(version.empty());
  std::vector<Binary> binaries = AbslBinaries();
  binaries.push_back({"ferry-kv", "kvstore/tool/ferry-kv", {}});
  std::set<std::string> commits;
  const std::regex commit(R"(commit: ([0-9a-f]{40}(-dirty)?|unknown))");
  const std::regex build(R"(build: (opt|dbg|fastbuild), (gcc|clang) [0-9.]+, C\+\+1[47], .*)"
                         R"(sanitizers: (none|address|thread))");
  for (const Binary& binary : binaries) {
    SCOPED_TRACE(binary.name);
    const CommandResult run = RunCommand(binary.path + " --version");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 3u) << run.out;
    EXPECT_EQ(lines[0], binary.name + " " + version);
    std::smatch m;
    EXPECT_TRUE(std::regex_match(lines[1], m, commit)) << lines[1];
    commits.insert(lines[1]);
    EXPECT_TRUE(std::regex_match(lines[2], build)) << lines[2];
  }
  EXPECT_EQ(commits.size(), 1u) << "binaries of one build name different commits";
}

TEST(CommandLineTest, BadFlagsAndLogFormatsExitNamingThem) {
  for (const Binary& binary : AbslBinaries()) {
    SCOPED_TRACE(binary.name);
    CommandResult run = RunCommand(binary.path + " --no_such_flag=1");
    EXPECT_NE(run.exit_code, 0);
    EXPECT_NE(run.err.find("no_such_flag"), std::string::npos) << run.err;
    run = RunCommand(binary.path + " --log_format=xml");
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_NE(run.err.find("--log_format"), std::string::npos) << run.err;
  }
  const CommandResult run = RunCommand("kvstore/tool/ferry-kv stats /nonexistent --log_format=xml");
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("--log_format"), std::string::npos) << run.err;
}

// Each line of `log` is a JSON object with the fields every Ferry log line has; returns them.
std::vector<nlohmann::json> JsonLines(const std::string& log, const std::string& what) {
  std::vector<nlohmann::json> records;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    auto record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object()) {
      ADD_FAILURE() << what << ": not a JSON line: " << line;
      continue;
    }
    for (const char* field : {"ts", "level", "thread", "file", "line", "msg"}) {
      EXPECT_TRUE(record.contains(field)) << what << ": no " << field << " in " << line;
    }
    records.push_back(std::move(record));
  }
  return records;
}

void ExpectPromtoolClean(int admin_port, const std::string& what) {
  std::string metrics;
  ASSERT_EQ(HttpGet(admin_port, "/metrics", &metrics), 200) << what;
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/metrics-", admin_port);
  std::ofstream(path) << metrics;
  const CommandResult run = RunCommand(absl::StrCat("promtool check metrics < ", path));
  EXPECT_EQ(run.exit_code, 0) << what << ": promtool check metrics:\n" << run.out << run.err;
}

TEST(ServicesTest, JsonLogsWithTraceIdsAndCleanMetricsOnEveryService) {
  const char* model = std::getenv("FERRY_MODEL_GGUF");
  ASSERT_NE(model, nullptr) << "FERRY_MODEL_GGUF: the default model's GGUF (its tokenizer)";
  const std::vector<std::string> json = {"--log_format=json"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), json.begin(), json.end());
    return args;
  };
  const std::string store_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/store");
  auto store = std::make_unique<ServiceProcess>(
      "kvstore/service/ferry-kvstore", with({"--dir=" + store_dir, "--capacity=64MiB",
                                             "--segment_bytes=8MiB", "--max_object_bytes=4MiB"}));
  ASSERT_TRUE(store->ready()) << store->LogTail();
  const std::vector<std::string> null_worker = {
      std::string("--model=") + model, "--engine=null",   "--block_tokens=16",
      "--kv_pool_bytes=64MiB",         "--transport=ucx", "--ucx_tls=tcp"};
  auto worker = std::make_unique<ServiceProcess>("services/worker/ferry-worker", with(null_worker));
  auto prefill =
      std::make_unique<ServiceProcess>("services/worker/ferry-prefill", with(null_worker));
  auto decode = std::make_unique<ServiceProcess>("services/worker/ferry-decode", with(null_worker));
  ASSERT_TRUE(worker->ready()) << worker->LogTail();
  ASSERT_TRUE(prefill->ready()) << prefill->LogTail();
  ASSERT_TRUE(decode->ready()) << decode->LogTail();
  auto router = std::make_unique<ServiceProcess>(
      "router/ferry-router", with({std::string("--model=") + model, "--served_model_name=smol",
                                   "--workers=" + worker->address(), "--log_level=debug"}));
  ASSERT_TRUE(router->ready()) << router->LogTail();

  const std::string trace = "operability-trace-7";
  std::string body;
  int status = -1;
  for (int i = 0; i < 500 && status != 200; ++i) {  // until the router saw its worker up
    status = HttpPost(router->grpc_port(), "/v1/chat/completions",
                      R"({"model":"smol","messages":[{"role":"user","content":"hi"}],)"
                      R"("max_tokens":3})",
                      {{"x-request-id", trace}}, &body);
    if (status != 200) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(status, 200) << body;

  const std::vector<std::pair<std::string, ServiceProcess*>> services = {
      {"ferry-kvstore", store.get()},
      {"ferry-worker", worker.get()},
      {"ferry-prefill", prefill.get()},
      {"ferry-decode", decode.get()},
      {"ferry-router", router.get()}};
  for (const auto& [name, process] : services) ExpectPromtoolClean(process->admin_port(), name);

  for (const auto& [name, process] : services) {
    process->Signal(SIGTERM);
    EXPECT_EQ(process->WaitForExit(absl::Seconds(60)), 0) << name << ": " << process->LogTail();
  }
  for (const auto& [name, process] : services) {
    const auto records = JsonLines(process->LogTail(size_t{16} << 20), name);
    EXPECT_FALSE(records.empty()) << name << " logged nothing";
  }
  int traced = 0;
  for (const auto& record : JsonLines(router->LogTail(size_t{16} << 20), "ferry-router")) {
    if (record.value("trace_id", "") == trace) ++traced;
  }
  EXPECT_GE(traced, 1) << "no router line carries the request's trace id:\n" << router->LogTail();
}

}  // namespace
}  // namespace ferry
