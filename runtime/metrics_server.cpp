#include "runtime/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

namespace tpc {

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(int port, bool anyInterface) {
  auto s = std::unique_ptr<MetricsServer>(new MetricsServer());
  s->listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listenFd_ < 0) return makeError("--metrics-port: cannot open a socket: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(s->listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(anyInterface ? INADDR_ANY : INADDR_LOOPBACK);
  if (::bind(s->listenFd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s->listenFd_, 8) != 0) {
    const int err = errno;
    ::close(s->listenFd_);
    s->listenFd_ = -1;
    const char* hint = err == EACCES   ? " (ports below 1024 need root; pick one from 1024 up, e.g. 9400)"
                       : err == EADDRINUSE ? " (another process is using the port; pick another)"
                                           : "";
    return makeError("--metrics-port ", port, ": cannot listen: ", std::strerror(err), hint);
  }
  socklen_t len = sizeof addr;
  ::getsockname(s->listenFd_, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = ntohs(addr.sin_port);
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listenFd_ >= 0) ::close(listenFd_);
}

void MetricsServer::publish(const std::map<std::string, double>& figures) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, v] : figures) figures_[k] = v;
}

std::string MetricsServer::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out.precision(10);
  for (const auto& [k, v] : figures_) {
    out << "# TYPE tpc_" << k << " gauge\n";
    out << "tpc_" << k << " ";
    // Prometheus' text format spells these NaN, +Inf and -Inf (C++ streams print nan and inf).
    if (std::isnan(v)) out << "NaN";
    else if (std::isinf(v)) out << (v > 0 ? "+Inf" : "-Inf");
    else out << v;
    out << "\n";
  }
  return out.str();
}

void MetricsServer::serve() {
  while (!stop_) {
    pollfd p{listenFd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;  // wake up to notice stop_
    int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char buf[1024];
    pollfd q{fd, POLLIN, 0};
    ssize_t n = ::poll(&q, 1, 1000) > 0 ? ::recv(fd, buf, sizeof buf - 1, 0) : 0;
    std::string request(buf, n > 0 ? static_cast<size_t>(n) : 0);
    std::string body, status = "200 OK";
    if (request.rfind("GET /metrics", 0) == 0 || request.rfind("GET / ", 0) == 0) {
      body = render();
    } else {
      status = "404 Not Found";
      body = "tpc serves /metrics\n";
    }
    std::string reply = "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    for (size_t sent = 0; sent < reply.size();) {
      ssize_t k = ::send(fd, reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
      if (k <= 0) break;
      sent += static_cast<size_t>(k);
    }
    ::close(fd);
  }
}

}  // namespace tpc
