#include "services/common/testing/dnsmasq.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/common/dns_resolver.h"

namespace ferry {
namespace {

constexpr char kDnsmasq[] = "/usr/sbin/dnsmasq";

// A port free on 127.0.0.1 for both UDP and TCP now (dnsmasq serves both; it cannot take port 0).
int FreeDnsPort() {
  for (int attempt = 0; attempt < 32; ++attempt) {
    int udp = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(udp, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(udp, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      close(udp);
      continue;
    }
    int tcp = socket(AF_INET, SOCK_STREAM, 0);
    const bool both = bind(tcp, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(tcp);
    close(udp);
    if (both) return ntohs(addr.sin_port);
  }
  return 0;
}

}  // namespace

Dnsmasq::Dnsmasq(const std::string& hosts) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  hosts_path_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/dnsmasq_hosts.", getpid(), ".",
                             reinterpret_cast<uintptr_t>(this));
  std::ofstream(hosts_path_) << "127.0.0.9 ready.test\n" << hosts;
}

Dnsmasq::~Dnsmasq() {
  Stop();
  unlink(hosts_path_.c_str());
}

std::string Dnsmasq::server() const { return absl::StrCat("127.0.0.1:", port_); }

bool Dnsmasq::Launch() {
  port_ = FreeDnsPort();
  if (port_ == 0) return false;
  std::vector<std::string> args = {kDnsmasq,
                                   "--keep-in-foreground",
                                   "--no-daemon",
                                   "--conf-file=/dev/null",
                                   "--pid-file=",
                                   "--listen-address=127.0.0.1",
                                   "--bind-interfaces",
                                   absl::StrCat("--port=", port_),
                                   "--no-resolv",
                                   "--no-hosts",
                                   "--local=/test/",
                                   absl::StrCat("--addn-hosts=", hosts_path_),
                                   "--local-ttl=0",
                                   "--cache-size=0",
                                   "--no-negcache",
                                   "--user=" + std::string(getuid() == 0 ? "root" : ""),
                                   "--quiet-dhcp"};
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid_ > 0;
}

void Dnsmasq::Stop() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

bool Dnsmasq::Exited() {
  int status;
  if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) pid_ = -1;  // reaped: not ours now
  return pid_ <= 0;
}

absl::Status Dnsmasq::Start() {
  if (access(kDnsmasq, X_OK) != 0) {
    return absl::FailedPreconditionError("dnsmasq is missing: ./ferry setup");
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (!Launch()) continue;
    DnsOptions options;
    options.servers = {server()};
    options.timeout = absl::Milliseconds(500);
    auto resolver = DnsResolver::Create(options);
    if (!resolver.ok()) return resolver.status();
    // Up once it answers (each lookup waits at most its own timeout).
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline && !Exited()) {
      if ((*resolver)->Addresses("ready.test").ok()) return absl::OkStatus();
    }
    Stop();
  }
  return absl::UnavailableError("dnsmasq did not answer");
}

}  // namespace ferry
