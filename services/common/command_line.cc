#include "services/common/command_line.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "engine/common/log.h"
#include "engine/common/mutex_mode.h"
#include "engine/common/units.h"
#include "services/common/build_info.h"

ABSL_FLAG(std::string, log_format, "text",
          "log lines on stderr: text (glog-like) or json (one object a line: ts, level, thread, "
          "file, line, msg, and trace_id where a request has one)");
ABSL_FLAG(std::string, log_level, "info", "least severe level logged: debug, info, warning, error");

namespace ferry {
namespace {

// This file's flags are every binary's; HelpText lists them after the binary's own.
bool IsCommonFlagFile(absl::string_view file) {
  return absl::EndsWith(file, "services/common/command_line.cc");
}

// absl's built-in flags (--flagfile, --fromenv, --undefok, the --help variants, ...).
bool IsAbslFlagFile(absl::string_view file) { return absl::StrContains(file, "absl/"); }

std::string TypeName(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "bool";
  if (flag.IsOfType<int32_t>()) return "int";
  if (flag.IsOfType<int64_t>()) return "int64";
  if (flag.IsOfType<uint64_t>()) return "uint64";
  if (flag.IsOfType<double>()) return "double";
  if (flag.IsOfType<float>()) return "float";
  if (flag.IsOfType<std::string>()) return "string";
  if (flag.IsOfType<absl::Duration>()) return "duration";
  if (flag.IsOfType<std::vector<std::string>>()) return "list";
  return "value";
}

// `text` after `indent` spaces, broken at spaces into lines of at most 100 columns (a longer word
// stays whole).
void AppendWrapped(absl::string_view text, int indent, std::string* out) {
  constexpr size_t kWidth = 100;
  const std::string pad(indent, ' ');
  size_t column = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > 0 && column + 1 + word.size() > kWidth) {
      out->push_back('\n');
      column = 0;
    }
    if (column == 0) {
      out->append(pad);
      column = pad.size();
    } else {
      out->push_back(' ');
      ++column;
    }
    out->append(word.data(), word.size());
    column += word.size();
  }
  out->push_back('\n');
}

void AppendFlag(const absl::CommandLineFlag& flag, std::string* out) {
  const std::string type = TypeName(flag);
  std::string value = flag.DefaultValue();
  if (type == "string" || type == "list") value = absl::StrCat("\"", value, "\"");
  absl::StrAppend(out, "  --", flag.Name(), " (", type, ", default ", value, ")\n");
  AppendWrapped(flag.Help(), 6, out);
}

// Whether argv asks for help or the version (up to a "--"): "help", "version" or "".
std::string InfoRequest(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "-h" || arg == "-help" || arg == "--help" || absl::StartsWith(arg, "--help=") ||
        arg == "--helpfull" || arg == "-helpfull" || arg == "--helpshort" || arg == "-helpshort") {
      return "help";
    }
    if (arg == "--version" || arg == "-version") return "version";
  }
  return "";
}

std::set<std::string>& Given() {
  static auto* given = new std::set<std::string>();
  return *given;
}

}  // namespace

std::string HelpText(absl::string_view program, absl::string_view usage) {
  std::vector<std::pair<absl::string_view, absl::CommandLineFlag*>> own, common;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    const std::string file = flag->Filename();
    if (IsAbslFlagFile(file)) continue;
    (IsCommonFlagFile(file) ? common : own).emplace_back(name, flag);
  }
  std::sort(own.begin(), own.end());
  std::sort(common.begin(), common.end());
  std::string out =
      absl::StrCat(program, ": ", usage,
                   "\n\nFlags (--name=value or --name value; a bool also --name, --noname):\n");
  for (const auto& [name, flag] : own) AppendFlag(*flag, &out);
  out.append("\nLogging (every Ferry binary):\n");
  for (const auto& [name, flag] : common) AppendFlag(*flag, &out);
  absl::StrAppend(&out,
                  "\nAlso: --help, --version (version, git commit, build configuration), "
                  "--flagfile=FILE (one flag a line), --fromenv=NAMES (FLAGS_name variables), "
                  "--undefok=NAMES.\n");
  return out;
}

std::vector<char*> ParseProgramCommandLine(absl::string_view program, absl::string_view usage,
                                           int argc, char** argv) {
  UseProgramMutexMode();
  absl::SetProgramUsageMessage(absl::StrCat(program, ": ", usage));
  const std::string request = InfoRequest(argc, argv);
  if (request == "help") {
    std::fputs(HelpText(program, usage).c_str(), stdout);
    std::exit(0);
  }
  if (request == "version") {
    std::fputs(VersionText(program).c_str(), stdout);
    std::exit(0);
  }
  NoteGivenFlags(argc, argv);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const std::string format = absl::GetFlag(FLAGS_log_format);
  if (format == "text") {
    SetLogFormat(LogFormat::kText);
  } else if (format == "json") {
    SetLogFormat(LogFormat::kJson);
  } else {
    ExitOnBadOption(
        std::string(program), "--log_format",
        absl::InvalidArgumentError(absl::StrCat("unknown log format '", format, "' (text, json)")));
  }
  auto level = ParseLogSeverity(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) ExitOnBadOption(std::string(program), "--log_level", level.status());
  SetMinLogSeverity(*level);
  return positional;
}

void NoteGivenFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg = arg.substr(arg[1] == '-' ? 2 : 1);
    Given().insert(arg.substr(0, arg.find('=')));
  }
}

bool FlagGiven(const std::string& name) { return Given().count(name) > 0; }

void ExitOnBadOption(const std::string& program, const std::string& what,
                     const absl::Status& status) {
  const std::string line = absl::StrCat(program, ": ", what, ": ", status.message());
  if (GetLogFormat() == LogFormat::kJson) {
    LOG(ERROR) << line;  // a JSON log stays JSON to its last line
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::exit(2);
}

uint64_t ByteSizeFlagOrExit(const std::string& program, const std::string& flag,
                            const std::string& text) {
  auto v = ParseByteSize(text);
  if (!v.ok()) ExitOnBadOption(program, "--" + flag, v.status());
  return *v;
}

}  // namespace ferry
