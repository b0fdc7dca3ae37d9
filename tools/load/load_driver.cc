#include "tools/load/load_driver.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "nlohmann/json.hpp"
#include "tools/load/http_stream_client.h"
#include "tools/load/openai_stream.h"

namespace ferry {

namespace asio = boost::asio;

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::nanoseconds Nanos(double seconds) {
  return std::chrono::nanoseconds(static_cast<int64_t>(std::max(0.0, seconds) * 1e9));
}

// One run: owned by RunLoad's frame, driven by its io_context's one thread.
class LoadRun {
 public:
  LoadRun(const Workload& workload, const LoadOptions& options, const DecodeTokens& decode)
      : workload_(workload),
        options_(options),
        decode_(decode),
        chat_(options.api == "chat"),
        progress_timer_(io_),
        arrival_timer_(io_) {
    const size_t n = workload.requests.size();
    records_.resize(n);
    next_turn_.assign(n, -1);
    session_messages_.resize(n);
    // Sessions: the next turn of each turn (the workload keeps a session's turns in order).
    std::vector<int64_t> last_of_session;
    for (size_t i = 0; i < n; ++i) {
      const LoadRequest& r = workload.requests[i];
      records_[i].id = r.id;
      if (r.session < 0 || r.turn == 0) {
        heads_.push_back(i);
      } else if (i > 0 && workload.requests[i - 1].session == r.session) {
        next_turn_[i - 1] = static_cast<int64_t>(i);
      } else {
        heads_.push_back(i);  // a turn whose predecessor is not right before it: on its own
      }
    }
  }

  absl::StatusOr<LoadRunResult> Run() {
    auto url = ParseHttpUrl(options_.url);
    if (!url.ok()) return url.status();
    auto client = HttpStreamClient::Create(&io_, *url);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    start_ = Clock::now();
    if (options_.mode == "closed") {
      for (int u = 0; u < options_.concurrency; ++u) NextUnit();
    } else {
      std::stable_sort(heads_.begin(), heads_.end(), [&](size_t a, size_t b) {
        return workload_.requests[a].arrival_s < workload_.requests[b].arrival_s;
      });
      ArmArrivals();
    }
    if (options_.progress != nullptr && options_.progress_interval > absl::ZeroDuration()) {
      ArmProgress();
    }
    if (ended_ == records_.size()) progress_timer_.cancel();
    io_.run();
    LoadRunResult result;
    result.wall_s = end_s_;
    result.records = std::move(records_);
    result.connections_opened = client_->connections_opened();
    result.retries = client_->retries();
    result.max_waiting = max_waiting_;
    client_.reset();
    return result;
  }

 private:
  double Now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  // Closed loop: a user takes the next head (a request, or a session's first turn).
  void NextUnit() {
    if (head_cursor_ < heads_.size()) Send(heads_[head_cursor_++]);
  }

  // Open loop: releases every head whose arrival time has come, then waits for the next.
  void ArmArrivals() {
    const double now = Now();
    while (head_cursor_ < heads_.size() &&
           workload_.requests[heads_[head_cursor_]].arrival_s <= now) {
      const size_t i = heads_[head_cursor_++];
      Admit(i, workload_.requests[i].arrival_s);
    }
    if (head_cursor_ >= heads_.size()) return;
    arrival_timer_.expires_after(Nanos(workload_.requests[heads_[head_cursor_]].arrival_s - now));
    arrival_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) ArmArrivals();
    });
  }

  // Open loop: sends now if a slot is free, else queues (`due`: when it should have gone).
  void Admit(size_t i, double due) {
    if (inflight_ < options_.max_inflight) {
      Send(i);
      return;
    }
    waiting_.push_back({i, due});
    max_waiting_ = std::max<int64_t>(max_waiting_, static_cast<int64_t>(waiting_.size()));
  }

  // After `delay_s`, `then` (a session's next turn after think time).
  void After(double delay_s, std::function<void()> then) {
    if (delay_s <= 0) {
      asio::post(io_, std::move(then));
      return;
    }
    auto timer = std::make_shared<asio::steady_timer>(io_, Nanos(delay_s));
    timer->async_wait([timer, then = std::move(then)](boost::system::error_code) { then(); });
  }

  std::string Body(size_t i) {
    const LoadRequest& r = workload_.requests[i];
    nlohmann::json j;
    j["model"] = options_.model;
    j["max_tokens"] = r.max_tokens;
    if (options_.ignore_eos) j["ignore_eos"] = true;
    j["temperature"] = options_.temperature;
    j["stream"] = true;
    j["stream_options"] = {{"include_usage", true}};
    if (!chat_) {
      j["prompt"] = r.prompt;
      return j.dump();
    }
    // Chat: the session's conversation so far, then this turn's new tokens as text.
    size_t from = 0;
    if (r.session >= 0 && r.turn > 0 && i > 0) {
      const LoadRequest& previous = workload_.requests[i - 1];
      from = std::min(r.prompt.size(),
                      previous.prompt.size() + static_cast<size_t>(previous.max_tokens));
    }
    const std::string text =
        decode_(absl::MakeConstSpan(r.prompt).subspan(from, r.prompt.size() - from));
    nlohmann::json messages = nlohmann::json::array();
    const size_t session = r.session >= 0 ? HeadOf(i) : i;
    for (const auto& m : session_messages_[session]) messages.push_back(m);
    nlohmann::json user = {{"role", "user"}, {"content", text}};
    messages.push_back(user);
    pending_user_[i] = std::move(user);
    j["messages"] = std::move(messages);
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  // The first turn of request i's session (sessions' turns are consecutive).
  size_t HeadOf(size_t i) const {
    const int64_t session = workload_.requests[i].session;
    while (i > 0 && workload_.requests[i - 1].session == session &&
           workload_.requests[i].turn > 0) {
      --i;
    }
    return i;
  }

  struct Stream {
    explicit Stream(bool keep_text) : reader(keep_text) {}
    OpenAiStreamReader reader;
    int status = 0;
    std::string error_body;
    double last_token_s = -1;
  };

  void Send(size_t i) {
    RequestRecord& record = records_[i];
    record.start_s = Now();
    ++inflight_;
    ++sent_;
    auto stream = std::make_shared<Stream>(chat_);
    HttpStreamClient::Callbacks callbacks;
    callbacks.on_header = [stream](int status) { stream->status = status; };
    callbacks.on_body = [this, i, stream](absl::string_view bytes) {
      if (stream->status != 200) {
        if (stream->error_body.size() < 2048) stream->error_body.append(bytes.data(), bytes.size());
        return;
      }
      const int events = stream->reader.Feed(bytes);
      if (events == 0) return;
      const double now = Now();
      RequestRecord& r = records_[i];
      if (stream->last_token_s < 0) {
        r.ttft_s = now - r.start_s;
        for (int e = 1; e < events; ++e) r.itl_s.push_back(0);
      } else {
        r.itl_s.push_back(now - stream->last_token_s);
        for (int e = 1; e < events; ++e) r.itl_s.push_back(0);
      }
      stream->last_token_s = now;
      streamed_events_ += events;
    };
    callbacks.on_done = [this, i, stream](absl::Status status) { End(i, *stream, status); };
    client_->Post(chat_ ? "/v1/chat/completions" : "/v1/completions", Body(i),
                  options_.request_timeout, std::move(callbacks));
  }

  void End(size_t i, const Stream& stream, const absl::Status& status) {
    const double now = Now();
    RequestRecord& r = records_[i];
    const LoadRequest& request = workload_.requests[i];
    r.e2e_s = now - r.start_s;
    const OpenAiStreamReader& reader = stream.reader;
    if (!status.ok()) {
      r.error = std::string(status.message());
    } else if (stream.status != 200) {
      std::string message = stream.error_body;
      const auto j = nlohmann::json::parse(stream.error_body, nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].is_object() &&
          j["error"].contains("message") && j["error"]["message"].is_string()) {
        message = j["error"]["message"].get<std::string>();
      }
      r.error = absl::StrCat("HTTP ", stream.status, ": ", message.substr(0, 300));
    } else if (!reader.error().empty()) {
      r.error = absl::StrCat("error event: ", reader.error());
    } else if (!reader.done()) {
      r.error = "the stream ended without [DONE]";
    } else {
      r.ok = true;
    }
    if (reader.token_events() == 0) r.ttft_s = r.e2e_s;
    if (reader.has_usage()) {
      r.prompt_tokens = reader.prompt_tokens();
      r.output_tokens = reader.completion_tokens();
      r.cached_tokens = reader.cached_tokens();
    } else {
      r.prompt_tokens = chat_ ? 0 : static_cast<int64_t>(request.prompt.size());
      r.output_tokens = reader.token_events();
    }
    ok_ += r.ok ? 1 : 0;
    --inflight_;
    ++ended_;
    end_s_ = std::max(end_s_, now);
    if (chat_) {  // the conversation goes on with the user's message and the real reply
      auto& history = session_messages_[request.session >= 0 ? HeadOf(i) : i];
      history.push_back(std::move(pending_user_[i]));
      history.push_back({{"role", "assistant"}, {"content", reader.text()}});
      pending_user_.erase(i);
    }
    const int64_t next = next_turn_[i];
    if (options_.mode == "closed") {
      if (next >= 0) {
        After(workload_.think_s, [this, next] { Send(static_cast<size_t>(next)); });
      } else {
        NextUnit();
      }
    } else {
      if (next >= 0) {
        const double due = std::max(workload_.requests[static_cast<size_t>(next)].arrival_s,
                                    now + workload_.think_s);
        After(due - now, [this, next, due] { Admit(static_cast<size_t>(next), due); });
      }
      while (!waiting_.empty() && inflight_ < options_.max_inflight) {
        const auto [w, due] = waiting_.front();
        waiting_.pop_front();
        records_[w].queued_s = std::max(0.0, Now() - due);
        Send(w);
      }
    }
    if (ended_ == records_.size()) {
      progress_timer_.cancel();
      arrival_timer_.cancel();
      if (options_.progress != nullptr && options_.progress_interval > absl::ZeroDuration()) {
        PrintProgress();
      }
    }
  }

  void ArmProgress() {
    progress_timer_.expires_after(
        std::chrono::nanoseconds(absl::ToInt64Nanoseconds(options_.progress_interval)));
    progress_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      PrintProgress();
      ArmProgress();
    });
  }

  void PrintProgress() {
    const double now = Now();
    const double dt = std::max(1e-9, now - last_progress_s_);
    const double rps = static_cast<double>(ended_ - last_ended_) / dt;
    const double tps = static_cast<double>(streamed_events_ - last_events_) / dt;
    std::fprintf(options_.progress,
                 "[%7.1fs] sent %lld  done %lld  failed %lld  in flight %d  waiting %zu  "
                 "%.1f req/s  %.0f tok/s\n",
                 now, static_cast<long long>(sent_), static_cast<long long>(ended_),
                 static_cast<long long>(ended_ - ok_), inflight_, waiting_.size(), rps, tps);
    std::fflush(options_.progress);
    last_progress_s_ = now;
    last_ended_ = ended_;
    last_events_ = streamed_events_;
  }

  const Workload& workload_;
  const LoadOptions& options_;
  const DecodeTokens& decode_;
  const bool chat_;
  asio::io_context io_;
  std::unique_ptr<HttpStreamClient> client_;
  asio::steady_timer progress_timer_, arrival_timer_;
  Clock::time_point start_;
  std::vector<RequestRecord> records_;
  std::vector<int64_t> next_turn_;
  std::vector<size_t> heads_;  // requests that start a unit (closed) or arrive (open)
  size_t head_cursor_ = 0;
  std::deque<std::pair<size_t, double>> waiting_;  // open: (request, due)
  int64_t max_waiting_ = 0;
  // Chat: each session's messages so far (indexed by its first turn), and each request's user
  // message until it ends.
  std::vector<std::vector<nlohmann::json>> session_messages_;
  std::unordered_map<size_t, nlohmann::json> pending_user_;
  int inflight_ = 0;
  size_t ended_ = 0;
  int64_t sent_ = 0, ok_ = 0, streamed_events_ = 0;
  double end_s_ = 0;
  double last_progress_s_ = 0;
  size_t last_ended_ = 0;
  int64_t last_events_ = 0;
};

}  // namespace

absl::Status ValidateLoadOptions(const LoadOptions& o) {
  if (o.api != "completions" && o.api != "chat") {
    return absl::InvalidArgumentError("api must be completions or chat");
  }
  if (o.mode != "closed" && o.mode != "open") {
    return absl::InvalidArgumentError("mode must be closed or open");
  }
  if (o.mode == "closed" && o.concurrency < 1) {
    return absl::InvalidArgumentError("concurrency must be at least 1");
  }
  if (o.max_inflight < 1) return absl::InvalidArgumentError("max_inflight must be at least 1");
  if (o.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("request_timeout must be positive");
  }
  if (o.model.empty()) return absl::InvalidArgumentError("no model");
  return ParseHttpUrl(o.url).status();
}

absl::StatusOr<LoadRunResult> RunLoad(const Workload& workload, const LoadOptions& options,
                                      const DecodeTokens& decode) {
  if (absl::Status s = ValidateLoadOptions(options); !s.ok()) return s;
  if (options.api == "chat" && !decode) {
    return absl::InvalidArgumentError("api chat needs a tokenizer to decode the prompts");
  }
  LoadRun run(workload, options, decode);
  return run.Run();
}

std::string RecordJson(const RequestRecord& r) {
  nlohmann::json j;
  j["id"] = r.id;
  j["ok"] = r.ok;
  if (!r.ok) j["error"] = r.error;
  j["start_s"] = r.start_s;
  j["queued_s"] = r.queued_s;
  j["ttft_s"] = r.ttft_s;
  j["e2e_s"] = r.e2e_s;
  j["tpot_s"] = Tpot(r);
  j["prompt_tokens"] = r.prompt_tokens;
  j["cached_tokens"] = r.cached_tokens;
  j["output_tokens"] = r.output_tokens;
  j["itl_s"] = r.itl_s;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry
