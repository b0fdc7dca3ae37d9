// ferry-worker-cli: talks to a ferry-worker over gRPC (until the router's HTTP front door
// exists, this is how a person calls a worker by hand).
//
//   ferry-worker-cli generate --addr 127.0.0.1:7500 --chat "What is the capital of France?"
//   ferry-worker-cli generate --addr ... --max_tokens 32 --temperature 0.7 --seed 3 "Once upon"
//   ferry-worker-cli watch --addr ... [--count N]     # the Watch stream, one line per message
//   ferry-worker-cli abort --addr ... REQUEST_ID
//   ferry-worker-cli drain --addr ... [--grace 30]
//
// Text is tokenized with the model's tokenizer (--model, default the one ./ferry models path
// prints; --chat applies its chat template to a one-message conversation). Prints the streamed
// text, then the finish reason and usage on stderr. Exit status: 0 on success, 1 when the call
// failed, 2 on bad usage.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf_file.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/common/command_line.h"
#include "services/common/shared_token.h"
#include "services/worker/worker_options.h"
#include "tools/worker_cli/worker_client.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:7500", "the worker's gRPC address");
ABSL_FLAG(std::string, model, "", "the model whose tokenizer encodes the text (default: ferry's)");
ABSL_FLAG(bool, chat, false, "apply the model's chat template (one user message)");
ABSL_FLAG(std::string, system, "", "with --chat: a system message first");
ABSL_FLAG(int, max_tokens, 128, "tokens to generate at most");
ABSL_FLAG(double, temperature, 0, "0: greedy");
ABSL_FLAG(double, top_p, 1, "nucleus sampling");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(int, n, 1, "choices");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings (comma-separated)");
ABSL_FLAG(std::string, id, "", "request id (default: cli-<pid>)");
ABSL_FLAG(int, count, 0, "watch: stop after this many messages (0: until interrupted)");
ABSL_FLAG(int, grace, 0, "drain: seconds running requests may continue (0: the worker's)");
ABSL_FLAG(std::string, auth_token_file, "", "the shared token (default: $FERRY_AUTH_TOKEN)");
ABSL_FLAG(int, timeout, 600, "seconds a call may take");

namespace {

namespace v1 = ferry::v1;

int Fail(const std::string& what) {
  std::fprintf(stderr, "ferry-worker-cli: %s\n", what.c_str());
  return 1;
}

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "none";
  }
}

int Generate(ferry::WorkerClient& client, const std::string& text) {
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? ferry::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  auto gguf = ferry::GgufFile::Open(path);
  if (!gguf.ok()) return Fail(absl::StrCat("--model ", path, ": ", gguf.status().message()));
  auto tokenizer = ferry::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));
  std::vector<ferry::TokenId> ids;
  if (absl::GetFlag(FLAGS_chat)) {
    auto chat = ferry::ChatTemplate::FromGguf(**gguf);
    if (!chat.ok()) return Fail(std::string(chat.status().message()));
    ferry::ChatTemplateInputs inputs;
    if (!absl::GetFlag(FLAGS_system).empty()) {
      inputs.messages.push_back({{"role", "system"}, {"content", absl::GetFlag(FLAGS_system)}});
    }
    inputs.messages.push_back({{"role", "user"}, {"content", text}});
    inputs.add_generation_prompt = true;
    auto prompt = (*chat)->Apply(inputs);
    if (!prompt.ok()) return Fail(std::string(prompt.status().message()));
    auto encoded = (*tokenizer)->Encode(ferry::PromptSegments(*prompt));
    if (!encoded.ok()) return Fail(std::string(encoded.status().message()));
    ids = *std::move(encoded);
  } else {
    auto encoded = (*tokenizer)->Encode(text);
    if (!encoded.ok()) return Fail(std::string(encoded.status().message()));
    ids = *std::move(encoded);
  }
  v1::GenerateRequest request;
  request.set_aggregated(true);
  v1::TokenizedRequest* r = request.mutable_request();
  r->mutable_context()->set_request_id(
      absl::GetFlag(FLAGS_id).empty() ? absl::StrCat("cli-", getpid()) : absl::GetFlag(FLAGS_id));
  for (ferry::TokenId t : ids) r->add_prompt_token_ids(t);
  v1::SamplingParams* s = r->mutable_sampling();
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  s->set_seed(absl::GetFlag(FLAGS_seed));
  s->set_max_tokens(static_cast<uint32_t>(absl::GetFlag(FLAGS_max_tokens)));
  s->set_n(static_cast<uint32_t>(absl::GetFlag(FLAGS_n)));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) s->add_stop_strings(stop);
  const bool one = absl::GetFlag(FLAGS_n) <= 1;
  const ferry::GenerateResult result = client.Generate(
      request, absl::Seconds(absl::GetFlag(FLAGS_timeout)), [&](const v1::GenerateEvent& e) {
        if (one && e.has_tokens()) {
          std::fwrite(e.tokens().text().data(), 1, e.tokens().text().size(), stdout);
          std::fflush(stdout);
        }
        return true;
      });
  if (!one) {
    for (size_t c = 0; c < result.choices.size(); ++c) {
      std::printf("[%zu] %s\n", c, result.choices[c].text.c_str());
    }
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);
  if (result.has_error) return Fail(absl::StrCat("error: ", result.error.message()));
  if (!result.status.ok())
    return Fail(absl::StrCat("call failed: ", result.status.error_message()));
  std::vector<std::string> finishes;
  for (const ferry::ChoiceOutput& c : result.choices) finishes.push_back(FinishName(c.finish));
  std::fprintf(stderr, "finish: %s; prompt %u tokens (%u cached), completion %u tokens\n",
               absl::StrJoin(finishes, ", ").c_str(), result.usage.prompt_tokens(),
               result.usage.cached_tokens(), result.usage.completion_tokens());
  return 0;
}

int Watch(ferry::WorkerClient& client) {
  auto stream = client.Watch(v1::WatchRequest(), absl::Seconds(absl::GetFlag(FLAGS_timeout)));
  v1::WorkerStatus status;
  int n = 0;
  while (stream->Next(&status)) {
    int64_t hashes = 0;
    for (const v1::KvEvent& e : status.kv_events()) hashes += e.block_hashes_size();
    const v1::WorkerLoad& l = status.load();
    std::printf(
        "seq=%llu%s%s%s hashes=%lld queued=%u running=%u kv_used=%llu kv_free=%llu cached=%llu "
        "step_ms=%.2f prefill_tps=%.0f decode_tps=%.0f drain=%s\n",
        static_cast<unsigned long long>(status.sequence()), status.snapshot() ? " snapshot" : "",
        status.snapshot_continues() ? " continues" : "", status.heartbeat() ? " heartbeat" : "",
        static_cast<long long>(hashes), l.queued_requests(), l.running_requests(),
        static_cast<unsigned long long>(l.used_kv_blocks()),
        static_cast<unsigned long long>(l.free_kv_blocks()),
        static_cast<unsigned long long>(l.cached_kv_blocks()), l.step_time_ms(),
        l.prefill_tokens_per_second(), l.decode_tokens_per_second(),
        v1::DrainState_Name(status.drain_state()).c_str());
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_count) > 0 && ++n >= absl::GetFlag(FLAGS_count)) {
      stream->Cancel();
      break;
    }
  }
  const grpc::Status end = stream->Finish();
  if (!end.ok() && end.error_code() != grpc::StatusCode::CANCELLED) {
    return Fail(absl::StrCat("watch ended: ", end.error_message()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = ferry::ParseProgramCommandLine(
      "ferry-worker-cli",
      "calls one worker: ferry-worker-cli generate|watch|abort|drain [flags] [TEXT|REQUEST_ID]",
      argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  auto token = ferry::LoadSharedToken(absl::GetFlag(FLAGS_auth_token_file));
  if (!token.ok()) return Fail(std::string(token.status().message()));
  ferry::WorkerClient client(absl::GetFlag(FLAGS_addr), token->current());
  const std::string command = args[1];
  std::vector<std::string> rest(args.begin() + 2, args.end());
  if (command == "generate" && !rest.empty()) return Generate(client, absl::StrJoin(rest, " "));
  if (command == "watch") return Watch(client);
  if (command == "abort" && rest.size() == 1) {
    bool found = false;
    const grpc::Status s = client.Abort(rest[0], &found);
    if (!s.ok()) return Fail(s.error_message());
    std::printf("%s\n", found ? "aborted" : "not found");
    return 0;
  }
  if (command == "drain") {
    v1::DrainResponse response;
    const grpc::Status s =
        client.Drain(static_cast<uint32_t>(absl::GetFlag(FLAGS_grace)), &response);
    if (!s.ok()) return Fail(s.error_message());
    std::printf("%s, %u running\n", v1::DrainState_Name(response.state()).c_str(),
                response.running_requests());
    return 0;
  }
  std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
  return 2;
}
