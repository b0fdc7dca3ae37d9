// A real DNS server for tests: Debian's dnsmasq in the foreground on a free 127.0.0.1 port,
// authoritative for "test." (a name it does not list is NXDOMAIN), answering from a hosts file
// with TTL 0 and no cache. Lookups reach it through DnsOptions::servers = {server()}.
//
//   Dnsmasq dns("127.0.0.1 evil.test\n");
//   ASSERT_TRUE(dns.Start().ok());   // up once it answers
//
// Killed and reaped with the object (and with the test process: PR_SET_PDEATHSIG).
// Thread-compatible.

#ifndef FERRY_SERVICES_COMMON_TESTING_DNSMASQ_H_
#define FERRY_SERVICES_COMMON_TESTING_DNSMASQ_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace ferry {

class Dnsmasq {
 public:
  // `hosts`: /etc/hosts lines ("127.0.0.1 a.test b.test\n"); "127.0.0.9 ready.test" is added.
  explicit Dnsmasq(const std::string& hosts);
  ~Dnsmasq();
  Dnsmasq(const Dnsmasq&) = delete;
  Dnsmasq& operator=(const Dnsmasq&) = delete;

  // Starts it and waits (20 s at most) until it answers ready.test; retries on another port if
  // the one chosen was taken meanwhile. FailedPrecondition if dnsmasq is not installed.
  absl::Status Start();
  void Stop();

  std::string server() const;  // "127.0.0.1:PORT"

 private:
  bool Launch();
  bool Exited();

  std::string hosts_path_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_TESTING_DNSMASQ_H_
