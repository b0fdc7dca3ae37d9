// Prints the GBNF grammar for a constraint, for the reference test:
//   to_gbnf schema FILE     JSON Schema (compact whitespace) -> grammar, or "error: ..." and exit 2
//   to_gbnf regex PATTERN   regex (full match) -> grammar
//   to_gbnf schemas FILE    a JSON array of schemas -> a JSON array of {"gbnf": ...} or
//                           {"error": ...}, one per schema (one process for a whole corpus)
//   to_gbnf schemas-bounded FILE   the same with bounded whitespace (at most 2)

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex_to_gbnf.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: to_gbnf schema|schemas|schemas-bounded FILE | to_gbnf regex PATTERN\n";
    return 1;
  }
  const std::string mode = argv[1];
  if (mode == "regex") {
    auto g = ferry::grammar::RegexToGbnf(argv[2]);
    if (!g.ok()) {
      std::cout << "error: " << g.status().message() << "\n";
      return 2;
    }
    std::cout << *g;
    return 0;
  }
  std::ifstream in(argv[2]);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    std::cerr << "cannot read " << argv[2] << "\n";
    return 1;
  }
  if (mode == "schema") {
    auto g = ferry::grammar::JsonSchemaTextToGbnf(text.str());
    if (!g.ok()) {
      std::cout << "error: " << g.status().message() << "\n";
      return 2;
    }
    std::cout << *g;
    return 0;
  }
  if (mode == "schemas" || mode == "schemas-bounded") {
    ferry::grammar::JsonSchemaOptions options;
    if (mode == "schemas-bounded") {
      options.whitespace = ferry::grammar::JsonWhitespace::kBounded;
      options.max_whitespace = 2;
    }
    auto all = nlohmann::ordered_json::parse(text.str(), nullptr, false);
    if (all.is_discarded() || !all.is_array()) {
      std::cerr << "not a JSON array\n";
      return 1;
    }
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& schema : all) {
      auto g = ferry::grammar::JsonSchemaToGbnf(schema, options);
      if (g.ok()) {
        out.push_back({{"gbnf", *g}});
      } else {
        out.push_back({{"error", std::string(g.status().message())}});
      }
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::cerr << "unknown mode " << mode << "\n";
  return 1;
}
