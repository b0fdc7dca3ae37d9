// DnsResolver and DnsDiscovery against a real DNS server: Debian's dnsmasq on a loopback port,
// answering from a hosts file the test rewrites (and signals dnsmasq to read again).

#include "services/common/dns_discovery.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "services/common/dns_resolver.h"

namespace ferry {
namespace {

using Naming = DnsDiscoveryOptions::Naming;

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

// dnsmasq in the foreground, authoritative for "test." (a name it does not list is NXDOMAIN),
// answering from hosts_ with TTL 0 and no cache. Killed (and reaped) with the object.
class Dnsmasq {
 public:
  Dnsmasq() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = tmp != nullptr ? tmp : "/tmp";
    hosts_ = absl::StrCat(dir_, "/hosts.", getpid());
    Write("");
  }
  ~Dnsmasq() { Stop(); }

  // Starts it on a free port; false if it did not stay up (the port was taken meanwhile).
  bool Start() {
    port_ = FreeDnsPort();
    if (port_ == 0) return false;
    std::vector<std::string> args = {
        "/usr/sbin/dnsmasq", "--keep-in-foreground",
        "--no-daemon",       "--conf-file=/dev/null",
        "--pid-file=",       "--listen-address=127.0.0.1",
        "--bind-interfaces", absl::StrCat("--port=", port_),
        "--no-resolv",       "--no-hosts",
        "--local=/test/",    absl::StrCat("--addn-hosts=", hosts_),
        "--local-ttl=0",     "--cache-size=0",
        "--no-negcache",     "--user=" + std::string(getuid() == 0 ? "root" : ""),
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
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  bool Exited() {
    int status;
    return pid_ <= 0 || waitpid(pid_, &status, WNOHANG) == pid_;
  }

  // Replaces the hosts file and has dnsmasq read it again (SIGHUP).
  void Write(const std::string& content) {
    const std::string next = hosts_ + ".next";
    std::ofstream(next) << content;
    rename(next.c_str(), hosts_.c_str());
    if (pid_ > 0) kill(pid_, SIGHUP);
  }
  std::string server() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  std::string dir_, hosts_;
  int port_ = 0;
  pid_t pid_ = -1;
};

class DnsDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(access("/usr/sbin/dnsmasq", X_OK), 0) << "dnsmasq is missing: ./ferry setup";
    dns_.Write("127.0.0.9 ready.test\n");
    // dnsmasq is up once it answers (a lookup waits at most its own timeout).
    for (int attempt = 0; attempt < 3 && !up_; ++attempt) {
      ASSERT_TRUE(dns_.Start());
      auto resolver = DnsResolver::Create(Options());
      ASSERT_TRUE(resolver.ok()) << resolver.status();
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (!up_ && absl::Now() < deadline && !dns_.Exited()) {
        up_ = (*resolver)->Addresses("ready.test").ok();
      }
      if (!up_) dns_.Stop();
    }
    ASSERT_TRUE(up_) << "dnsmasq did not answer";
  }

  // Serves `hosts` and waits until dnsmasq answers `name` with `want` (it reads the file again
  // on SIGHUP, in its own time).
  void Serve(const std::string& hosts, const std::string& name,
             const std::vector<std::string>& want) {
    dns_.Write(hosts);
    auto resolver = DnsResolver::Create(Options());
    ASSERT_TRUE(resolver.ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    absl::StatusOr<std::vector<std::string>> got;
    do {
      got = (*resolver)->Addresses(name);
    } while (!(got.ok() ? *got == want : want.empty() && absl::IsNotFound(got.status())) &&
             absl::Now() < deadline);
    ASSERT_TRUE(got.ok() ? *got == want : want.empty()) << "dnsmasq did not serve " << name;
  }

  DnsOptions Options() const {
    DnsOptions o;
    o.servers = {dns_.server()};
    o.timeout = absl::Milliseconds(500);
    return o;
  }

  Dnsmasq dns_;
  bool up_ = false;
};

TEST_F(DnsDiscoveryTest, ResolverAnswersAddressesNamesAndNotFound) {
  Serve(
      "127.0.0.21 pool.test\n127.0.0.22 pool.test\n"
      "127.0.0.31 node-0.kv.test kv.test\n",
      "kv.test", {"127.0.0.31"});
  auto resolver = DnsResolver::Create(Options());
  ASSERT_TRUE(resolver.ok());
  auto a = (*resolver)->Addresses("pool.test");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::vector<std::string>{"127.0.0.21", "127.0.0.22"}));
  auto name = (*resolver)->NameOf("127.0.0.31");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(*name, "node-0.kv.test");
  EXPECT_TRUE(absl::IsNotFound((*resolver)->Addresses("absent.test").status()));
  EXPECT_TRUE(absl::IsInvalidArgument((*resolver)->Addresses("bad name").status()));
  EXPECT_TRUE(absl::IsInvalidArgument((*resolver)->NameOf("not-an-ip").status()));

  // Nobody listening: Unavailable within the timeout, not NotFound.
  DnsOptions dead = Options();
  dead.servers = {absl::StrCat("127.0.0.1:", FreeDnsPort())};
  auto silent = DnsResolver::Create(dead);
  ASSERT_TRUE(silent.ok());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsUnavailable((*silent)->Addresses("pool.test").status()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  DnsOptions bad;
  bad.servers = {"dns.example:53"};
  EXPECT_FALSE(DnsResolver::Create(bad).ok());
  bad.servers = {"127.0.0.1:0"};
  EXPECT_FALSE(DnsResolver::Create(bad).ok());
}

// The endpoints handed to on_change, with a counter to wait on.
struct Seen {
  absl::Mutex mu;
  std::vector<std::string> endpoints ABSL_GUARDED_BY(mu);
  int calls ABSL_GUARDED_BY(mu) = 0;

  DnsDiscovery::OnChange Callback() {
    return [this](std::vector<std::string> e) {
      absl::MutexLock lock(&mu);
      endpoints = std::move(e);
      ++calls;
    };
  }
  // Whether the endpoints became `want` within `timeout`.
  bool WaitFor(const std::vector<std::string>& want, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    const auto done = [&] {
      mu.AssertHeld();
      return endpoints == want;
    };
    return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
};

TEST_F(DnsDiscoveryTest, MembersAddedAndRemovedArePickedUpWithinTheInterval) {
  Serve("127.0.0.21 prefill.test\n127.0.0.41 decode.test\n", "decode.test", {"127.0.0.41"});
  DnsDiscoveryOptions o;
  o.targets = {"prefill.test:7001", "decode.test:7002"};
  o.interval = absl::Milliseconds(200);
  o.dns = Options();
  Seen seen;
  auto d = DnsDiscovery::Start(o, seen.Callback());
  ASSERT_TRUE(d.ok()) << d.status();
  // The first round ran inside Start.
  EXPECT_EQ((*d)->endpoints(), (std::vector<std::string>{"127.0.0.21:7001", "127.0.0.41:7002"}));

  // Scale out decode, replace the prefill pod: seen within an interval (plus dnsmasq's reload).
  // Measured from when dnsmasq serves the change: one interval, plus a round's lookups (a loaded
  // machine's margin).
  Serve("127.0.0.22 prefill.test\n127.0.0.41 decode.test\n127.0.0.42 decode.test\n", "decode.test",
        {"127.0.0.41", "127.0.0.42"});
  const absl::Time served = absl::Now();
  EXPECT_TRUE(
      seen.WaitFor({"127.0.0.22:7001", "127.0.0.41:7002", "127.0.0.42:7002"}, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - served, o.interval + absl::Seconds(3));

  // A pool scaled to zero is empty (NXDOMAIN is an answer).
  dns_.Write("127.0.0.41 decode.test\n");
  EXPECT_TRUE(seen.WaitFor({"127.0.0.41:7002"}, absl::Seconds(10)));

  // The DNS server gone: the members stay, rounds go on (retried, not stopped).
  dns_.Stop();
  const int64_t rounds = (*d)->rounds();
  (*d)->ResolveSoon();
  EXPECT_TRUE((*d)->AwaitRounds(rounds + 2, absl::Seconds(10)));  // the second one a retry
  EXPECT_EQ((*d)->endpoints(), (std::vector<std::string>{"127.0.0.41:7002"}));
  absl::MutexLock lock(&seen.mu);
  EXPECT_EQ(seen.endpoints, (std::vector<std::string>{"127.0.0.41:7002"}));
}

TEST_F(DnsDiscoveryTest, StableNamesComeFromPtrRecordsAndSurviveANewAddress) {
  Serve(
      "127.0.0.31 kv-0.kv.test kv.test\n"
      "127.0.0.32 kv-1.kv.test kv.test\n",
      "kv.test", {"127.0.0.31", "127.0.0.32"});
  DnsDiscoveryOptions o;
  o.targets = {"kv.test:7400"};
  o.naming = Naming::kStableName;
  o.interval = absl::Milliseconds(200);
  o.stable_name_linger = absl::Seconds(2);
  o.dns = Options();
  Seen seen;
  auto d = DnsDiscovery::Start(o, seen.Callback());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->endpoints(),
            (std::vector<std::string>{"kv-0.kv.test:7400", "kv-1.kv.test:7400"}));
  int calls;
  {
    absl::MutexLock lock(&seen.mu);
    calls = seen.calls;
  }

  // kv-1 restarts on another address: the same endpoint, so no change is reported.
  Serve(
      "127.0.0.31 kv-0.kv.test kv.test\n"
      "127.0.0.35 kv-1.kv.test kv.test\n",
      "kv.test", {"127.0.0.31", "127.0.0.35"});
  // Two more rounds: the second one started after dnsmasq served the new address.
  const int64_t rounds = (*d)->rounds();
  (*d)->ResolveSoon();
  ASSERT_TRUE((*d)->AwaitRounds(rounds + 2, absl::Seconds(10)));
  EXPECT_EQ((*d)->endpoints(),
            (std::vector<std::string>{"kv-0.kv.test:7400", "kv-1.kv.test:7400"}));
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.calls, calls);
  }

  // kv-2 joins; kv-0 leaves the DNS: it stays for the linger (its pod may be being replaced),
  // then leaves at its end (a round runs then), not an interval later. The clock starts before
  // dnsmasq serves the change: no round can miss kv-0 earlier.
  const absl::Time served_at = absl::Now();
  Serve(
      "127.0.0.35 kv-1.kv.test kv.test\n"
      "127.0.0.36 kv-2.kv.test kv.test\n",
      "kv.test", {"127.0.0.35", "127.0.0.36"});
  const int64_t served = (*d)->rounds();
  (*d)->ResolveSoon();
  ASSERT_TRUE((*d)->AwaitRounds(served + 2, absl::Seconds(10)));
  EXPECT_EQ((*d)->endpoints(), (std::vector<std::string>{"kv-0.kv.test:7400", "kv-1.kv.test:7400",
                                                         "kv-2.kv.test:7400"}));
  EXPECT_TRUE(seen.WaitFor({"kv-1.kv.test:7400", "kv-2.kv.test:7400"}, absl::Seconds(20)));
  const absl::Duration took = absl::Now() - served_at;
  EXPECT_GE(took, o.stable_name_linger);
  // The linger counts from the first round that missed it (within an interval of the change).
  EXPECT_LT(took, o.stable_name_linger + o.interval + absl::Seconds(3));
}

TEST_F(DnsDiscoveryTest, AStableNameWithNoLingerLeavesWithTheRoundThatMissesIt) {
  Serve(
      "127.0.0.31 kv-0.kv.test kv.test\n"
      "127.0.0.32 kv-1.kv.test kv.test\n",
      "kv.test", {"127.0.0.31", "127.0.0.32"});
  DnsDiscoveryOptions o;
  o.targets = {"kv.test:7400"};
  o.naming = Naming::kStableName;
  o.interval = absl::Seconds(60);  // rounds only when asked
  o.stable_name_linger = absl::ZeroDuration();
  o.dns = Options();
  Seen seen;
  auto d = DnsDiscovery::Start(o, seen.Callback());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->endpoints(),
            (std::vector<std::string>{"kv-0.kv.test:7400", "kv-1.kv.test:7400"}));
  Serve("127.0.0.32 kv-1.kv.test kv.test\n", "kv.test", {"127.0.0.32"});
  const int64_t rounds = (*d)->rounds();
  (*d)->ResolveSoon();
  ASSERT_TRUE((*d)->AwaitRounds(rounds + 1, absl::Seconds(10)));
  EXPECT_EQ((*d)->endpoints(), (std::vector<std::string>{"kv-1.kv.test:7400"}));
}

TEST(DnsDiscoveryOptionsTest, BadOptionsAreRefused) {
  DnsDiscoveryOptions o;
  EXPECT_FALSE(DnsDiscovery::Start(o, [](std::vector<std::string>) {}).ok());
  o.targets = {"no-port"};
  EXPECT_FALSE(DnsDiscovery::Start(o, [](std::vector<std::string>) {}).ok());
  o.targets = {"name:99999"};
  EXPECT_FALSE(DnsDiscovery::Start(o, [](std::vector<std::string>) {}).ok());
  o.targets = {"name:80"};
  o.stable_name_linger = absl::Seconds(-1);
  EXPECT_FALSE(DnsDiscovery::Start(o, [](std::vector<std::string>) {}).ok());
  std::string host;
  int port;
  ASSERT_TRUE(SplitHostPort("[::1]:80", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(JoinHostPort(host, port), "[::1]:80");
}

}  // namespace
}  // namespace ferry
