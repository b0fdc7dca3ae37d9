#include "tools/load/load_tool.h"

#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/load/http_stream_client.h"

namespace ferry {
namespace {

constexpr absl::Duration kAskTimeout = absl::Seconds(10);

absl::StatusOr<std::string> FirstModel(const std::string& url) {
  ASSIGN_OR_RETURN(const std::string body, HttpGet(url + "/v1/models", kAskTimeout));
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return absl::UnavailableError(absl::StrCat("GET ", url, "/v1/models: no model listed"));
  }
  return j["data"][0]["id"].get<std::string>();
}

absl::StatusOr<int> AdminWorkers(const std::string& admin_url) {
  ASSIGN_OR_RETURN(const std::string body, HttpGet(admin_url + "/workers", kAskTimeout));
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_array()) {
    return absl::UnavailableError(absl::StrCat("GET ", admin_url, "/workers: not a list"));
  }
  return static_cast<int>(j.size());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("tokenizer: no such file or directory: ", path));
  }
  if (S_ISDIR(st.st_mode)) return Tokenizer::FromHfDirectory(path);
  ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
  return Tokenizer::FromGguf(*gguf);
}

}  // namespace

absl::Status RunLoadTool(LoadToolOptions o, std::FILE* out) {
  if (o.load.model.empty()) {
    ASSIGN_OR_RETURN(o.load.model, FirstModel(o.load.url));
  }
  std::string gpus_from = "--gpus";
  if (o.gpus <= 0 && !o.admin_url.empty()) {
    ASSIGN_OR_RETURN(o.gpus, AdminWorkers(o.admin_url));
    gpus_from = "the router's workers";
  }
  if (o.gpus <= 0) {
    o.gpus = 1;
    gpus_from = "default";
  }
  RETURN_IF_ERROR(ValidateLoadOptions(o.load));
  ASSIGN_OR_RETURN(const Workload workload, MakeWorkload(o.workload, o.load.mode == "open"));
  std::unique_ptr<Tokenizer> tokenizer;
  DecodeTokens decode;
  if (o.load.api == "chat") {
    if (o.tokenizer.empty()) {
      return absl::InvalidArgumentError("--api chat needs --tokenizer (or $FERRY_MODEL_GGUF)");
    }
    ASSIGN_OR_RETURN(tokenizer, LoadTokenizer(o.tokenizer));
    decode = [t = tokenizer.get()](absl::Span<const TokenId> ids) {
      auto text = t->Decode(ids, /*skip_special=*/true);
      return text.ok() ? *text : std::string();
    };
  }
  if (o.load.progress != nullptr) {
    std::fprintf(o.load.progress, "ferry-load: %s; %zu requests, %s loop, %s API, model %s\n",
                 workload.note.c_str(), workload.requests.size(), o.load.mode.c_str(),
                 o.load.api.c_str(), o.load.model.c_str());
  }
  ASSIGN_OR_RETURN(LoadRunResult run, RunLoad(workload, o.load, decode));

  if (!o.records_out.empty()) {
    std::ofstream records(o.records_out);
    for (const RequestRecord& r : run.records) records << RecordJson(r) << "\n";
    if (!records) return absl::UnavailableError(absl::StrCat("cannot write ", o.records_out));
  }
  const RunSummary summary = Summarize(run.records, o.slo, o.prices, o.gpus);
  std::string errors;  // the first few distinct failures, for people
  int shown = 0;
  for (const RequestRecord& r : run.records) {
    if (r.ok || shown >= 3 || errors.find(r.error) != std::string::npos) continue;
    absl::StrAppend(&errors, "  request ", r.id, ": ", r.error, "\n");
    ++shown;
  }
  std::fprintf(out, "ferry-load: %s\n%s loop (%s), %s API, model %s, %s\n%s", workload.note.c_str(),
               o.load.mode.c_str(),
               o.load.mode == "closed"
                   ? absl::StrCat("concurrency ", o.load.concurrency).c_str()
                   : absl::StrCat("max in flight ", o.load.max_inflight).c_str(),
               o.load.api.c_str(), o.load.model.c_str(),
               absl::StrCat("GPUs ", o.gpus, " (", gpus_from, ")").c_str(),
               SummaryTable(summary, o.prices).c_str());
  if (!errors.empty()) std::fprintf(out, "failures, e.g.:\n%s", errors.c_str());
  nlohmann::json j = SummaryJson(summary, o.prices);
  j["tool"] = "ferry-load";
  j["workload"] = {{"kind", workload.kind},
                   {"note", workload.note},
                   {"requests", workload.requests.size()},
                   {"dropped_requests", workload.dropped_requests},
                   {"cut_tokens", workload.cut_tokens}};
  j["mode"] = o.load.mode;
  j["api"] = o.load.api;
  j["model"] = o.load.model;
  if (o.load.mode == "closed") {
    j["concurrency"] = o.load.concurrency;
  } else {
    j["rate"] = o.workload.rate;
    j["arrivals"] = o.workload.rate > 0 ? o.workload.arrivals : "trace";
    j["max_inflight"] = o.load.max_inflight;
    j["max_waiting"] = run.max_waiting;
  }
  j["slo"] = {{"ttft_ms", o.slo.ttft_s * 1e3}, {"tpot_ms", o.slo.tpot_s * 1e3}};
  j["gpus_from"] = gpus_from;
  j["client"] = {{"connections", run.connections_opened}, {"retries", run.retries}};
  std::fprintf(out, "%s\n",
               j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(out);
  return absl::OkStatus();
}

}  // namespace ferry
