#include "services/planner/prometheus_text.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {

namespace {

constexpr size_t kMaxLabels = 64;

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_' || c == ':'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == ':'; }

// Prometheus' float: a decimal or hex float as strtod reads it, "NaN", "+Inf", "-Inf".
bool ParseValue(absl::string_view text, double* value) {
  if (text == "NaN") {
    *value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (text == "+Inf" || text == "Inf") {
    *value = std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "-Inf") {
    *value = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (text.empty() || text.size() > 64) return false;
  const std::string copy(text);  // strtod needs a terminated string
  char* end = nullptr;
  *value = std::strtod(copy.c_str(), &end);
  return end == copy.c_str() + copy.size();
}

// Parses `{k="v",...}` at the front of `*rest`, leaving what follows the '}'.
absl::Status ParseLabels(absl::string_view* rest,
                         std::vector<std::pair<std::string, std::string>>* labels) {
  absl::string_view s = *rest;
  s.remove_prefix(1);  // '{'
  while (true) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    if (s.empty()) return absl::InvalidArgumentError("unterminated labels");
    if (s.front() == '}') {
      s.remove_prefix(1);
      break;
    }
    if (!IsNameStart(s.front())) return absl::InvalidArgumentError("bad label name");
    size_t n = 1;
    while (n < s.size() && IsNameChar(s[n])) ++n;
    std::string key(s.substr(0, n));
    s.remove_prefix(n);
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    if (s.size() < 2 || s[0] != '=' || s[1] != '"') {
      return absl::InvalidArgumentError(absl::StrCat("label ", key, " has no quoted value"));
    }
    s.remove_prefix(2);
    std::string value;
    bool closed = false;
    while (!s.empty()) {
      const char c = s.front();
      s.remove_prefix(1);
      if (c == '"') {
        closed = true;
        break;
      }
      if (c != '\\') {
        value.push_back(c);
        continue;
      }
      if (s.empty()) break;
      const char e = s.front();
      s.remove_prefix(1);
      if (e == 'n') {
        value.push_back('\n');
      } else if (e == '\\' || e == '"') {
        value.push_back(e);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("label ", key, ": bad escape \\", std::string(1, e)));
      }
    }
    if (!closed) return absl::InvalidArgumentError(absl::StrCat("label ", key, " is unterminated"));
    if (labels->size() == kMaxLabels) {
      return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxLabels, " labels"));
    }
    labels->emplace_back(std::move(key), std::move(value));
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    if (!s.empty() && s.front() == ',') s.remove_prefix(1);
  }
  *rest = s;
  return absl::OkStatus();
}

}  // namespace

std::string PrometheusSample::Label(absl::string_view key) const {
  for (const auto& [k, v] : labels) {
    if (k == key) return v;
  }
  return "";
}

absl::StatusOr<std::vector<PrometheusSample>> ParsePrometheusText(
    absl::string_view text, const std::set<std::string, std::less<>>& names) {
  std::vector<PrometheusSample> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    size_t n = 0;
    while (n < line.size() && IsNameChar(line[n])) ++n;
    const absl::string_view name = line.substr(0, n);
    if (names.find(name) == names.end()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", line_number, " (", name, "): ", why));
    };
    if (name.empty() || !IsNameStart(name.front())) return bad("bad metric name");
    PrometheusSample sample;
    sample.name = std::string(name);
    absl::string_view rest = line.substr(n);
    if (!rest.empty() && rest.front() == '{') {
      if (absl::Status s = ParseLabels(&rest, &sample.labels); !s.ok()) return bad(s.message());
    }
    // The value, and an optional timestamp after it.
    std::vector<absl::string_view> fields =
        absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.empty() || fields.size() > 2) return bad("expected a value and at most a timestamp");
    if (rest.front() != ' ' && rest.front() != '\t') return bad("no space before the value");
    if (!ParseValue(fields[0], &sample.value)) return bad("bad value");
    out.push_back(std::move(sample));
  }
  return out;
}

}  // namespace ferry
