#include "tests/integration/service_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace ferry {

ServiceProcess::ServiceProcess(const std::string& binary, const std::vector<std::string>& args,
                               absl::Duration ready_timeout) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  log_path_ =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/service-", getpid(), "-", ++counter, ".log");
  int out[2];
  if (pipe(out) != 0) return;
  const int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    dup2(out[1], STDOUT_FILENO);
    if (log_fd >= 0) dup2(log_fd, STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  if (log_fd >= 0) close(log_fd);
  stdout_fd_ = out[0];
  if (pid_ < 0) return;
  // The ready line, within the timeout.
  std::string line;
  const absl::Time deadline = absl::Now() + ready_timeout;
  while (line.find('\n') == std::string::npos && absl::Now() < deadline) {
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&p, 1, std::max(ms, 1)) <= 0) continue;
    char buf[256];
    const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n <= 0) break;  // exited
    line.append(buf, static_cast<size_t>(n));
  }
  // "grpc_port=N admin_port=M" (or http_port=N for the router).
  ready_ =
      std::sscanf(line.c_str(), "%*[a-z]_port=%d admin_port=%d", &grpc_port_, &admin_port_) == 2;
}

ServiceProcess::~ServiceProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string ServiceProcess::address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }

void ServiceProcess::Signal(int signal_number) {
  if (pid_ > 0 && !reaped_) kill(pid_, signal_number);
}

int ServiceProcess::WaitForExit(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

bool ServiceProcess::running() {
  if (pid_ <= 0 || reaped_) return false;
  return WaitForExit(absl::ZeroDuration()) == -1;
}

std::string ServiceProcess::LogTail(size_t bytes) const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  const std::string all = s.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

namespace {

// Sends `request` to 127.0.0.1:port on a new connection: the response's status code (-1 when
// nothing answers) and its body.
template <typename Body>
int Exchange(int port, boost::beast::http::request<Body>& request, std::string* body) {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  beast::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) return -1;
  request.set(http::field::host, "127.0.0.1");
  http::write(socket, request, ec);
  if (ec) return -1;
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(socket, buffer, response, ec);
  if (ec) return -1;
  if (body != nullptr) *body = response.body();
  return response.result_int();
}

}  // namespace

int HttpGet(int port, const std::string& target, std::string* body) {
  namespace http = boost::beast::http;
  http::request<http::empty_body> request(http::verb::get, target, 11);
  return Exchange(port, request, body);
}

int HttpPost(int port, const std::string& target, const std::string& json_body,
             const std::vector<std::pair<std::string, std::string>>& headers, std::string* body) {
  namespace http = boost::beast::http;
  http::request<http::string_body> request(http::verb::post, target, 11);
  request.set(http::field::content_type, "application/json");
  for (const auto& [name, value] : headers) request.set(name, value);
  request.body() = json_body;
  request.prepare_payload();
  return Exchange(port, request, body);
}

double MetricValue(int admin_port, const std::string& metric) {
  std::string body;
  if (HttpGet(admin_port, "/metrics", &body) != 200) return -1;
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(metric + " ", 0) == 0) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(metric.size() + 1), &v)) return v;
    }
  }
  return -1;
}

bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

}  // namespace ferry
