// What every Ferry binary's main shares about its command line:
//
//   int main(int argc, char** argv) {
//     ferry::ParseProgramCommandLine("ferry-router", "the Ferry router: ...", argc, argv);
//
// - --help (also -h, --helpfull, --helpshort) prints HelpText: each flag of Ferry's own files the
//   binary links, with its type, default and description (absl's --help would list only the flags
//   of a file named after the binary), then exits 0. --version prints VersionText
//   (build_info.h) and exits 0.
// - --log_format=text|json and --log_level=debug|info|warning|error, defined here, set the log
//   (engine/common/log.h) for every binary alike.
// - Which flags were named on the command line (a flag given wins over a config file; Debian's
//   absl keeps CommandLineFlag::IsSpecifiedOnCommandLine private, so this reads argv itself).
// - A clean exit naming the program and the option that is wrong.
//
// Call ParseProgramCommandLine (or NoteGivenFlags, then absl::ParseCommandLine) once, from main,
// before any thread starts; FlagGiven is read-only after that.

#ifndef FERRY_SERVICES_COMMON_COMMAND_LINE_H_
#define FERRY_SERVICES_COMMON_COMMAND_LINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

ABSL_DECLARE_FLAG(std::string, log_format);
ABSL_DECLARE_FLAG(std::string, log_level);

namespace ferry {

// Handles --help and --version (printing to stdout and exiting 0), notes the flags given, parses
// argv with absl (a bad flag or value: absl's message, exit 1) and applies --log_format and
// --log_level (a bad value: ExitOnBadOption, exit 2). Returns the positional arguments, argv[0]
// first, as absl::ParseCommandLine does. `usage` is one line saying what the binary is.
std::vector<char*> ParseProgramCommandLine(absl::string_view program, absl::string_view usage,
                                           int argc, char** argv);

// The --help text: "PROGRAM: USAGE", then every flag of Ferry's own source files linked into the
// binary, sorted by name, as two lines each:
//   "  --name (TYPE, default VALUE)" and "      description"
// (TYPE: bool, int, int64, uint64, double, string, duration, list; a string's default is quoted),
// the common logging flags after the binary's own, and absl's built-in flags named last.
std::string HelpText(absl::string_view program, absl::string_view usage);

// Records the flags argv names ("--name=v", "--name v", "-name"; up to a "--").
void NoteGivenFlags(int argc, char** argv);
bool FlagGiven(const std::string& name);

// Prints "PROGRAM: WHAT: MESSAGE" to stderr (as an ERROR record under --log_format=json) and
// exits 2.
[[noreturn]] void ExitOnBadOption(const std::string& program, const std::string& what,
                                  const absl::Status& status);

// The bytes of a size flag's text ("2GiB", engine/common/units.h), or ExitOnBadOption naming
// --FLAG.
uint64_t ByteSizeFlagOrExit(const std::string& program, const std::string& flag,
                            const std::string& text);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_COMMAND_LINE_H_
