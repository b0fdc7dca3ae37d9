// What the service mains share about their command lines: which flags were named on it (a flag
// given wins over the config file; Debian's absl keeps CommandLineFlag::IsSpecifiedOnCommandLine
// private, so the mains read argv themselves), and a clean exit naming the program and the
// option that is wrong.
//
// Call NoteGivenFlags once, from main, before absl::ParseCommandLine; FlagGiven is read-only
// after that.

#ifndef FERRY_SERVICES_COMMON_COMMAND_LINE_H_
#define FERRY_SERVICES_COMMON_COMMAND_LINE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ferry {

// Records the flags argv names ("--name=v", "--name v", "-name"; up to a "--").
void NoteGivenFlags(int argc, char** argv);
bool FlagGiven(const std::string& name);

// Prints "PROGRAM: WHAT: MESSAGE" to stderr and exits 2.
[[noreturn]] void ExitOnBadOption(const std::string& program, const std::string& what,
                                  const absl::Status& status);

// The bytes of a size flag's text ("2GiB", engine/common/units.h), or ExitOnBadOption naming
// --FLAG.
uint64_t ByteSizeFlagOrExit(const std::string& program, const std::string& flag,
                            const std::string& text);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_COMMAND_LINE_H_
