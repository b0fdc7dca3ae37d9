#include "services/common/command_line.h"

#include <cstdio>
#include <cstdlib>
#include <set>

#include "engine/common/units.h"

namespace ferry {
namespace {

std::set<std::string>& Given() {
  static auto* given = new std::set<std::string>();
  return *given;
}

}  // namespace

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
  std::fprintf(stderr, "%s: %s: %s\n", program.c_str(), what.c_str(),
               std::string(status.message()).c_str());
  std::exit(2);
}

uint64_t ByteSizeFlagOrExit(const std::string& program, const std::string& flag,
                            const std::string& text) {
  auto v = ParseByteSize(text);
  if (!v.ok()) ExitOnBadOption(program, "--" + flag, v.status());
  return *v;
}

}  // namespace ferry
