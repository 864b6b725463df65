// `tpc run --metrics-port P`: the trainer's latest figures in Prometheus' text exposition format at
// http://HOST:P/metrics (one gauge per figure, named tpc_<figure>), served by one background thread.
// A scraper sees what the JSONL log holds: step, loss, lr, grad norm, tokens/s, elapsed, validation loss.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "ir/status.h"

namespace tpc {

class MetricsServer {
 public:
  // Listens on 127.0.0.1 (or every interface with `anyInterface`) port `port` (0: any free port).
  static Result<std::unique_ptr<MetricsServer>> start(int port, bool anyInterface = false);
  ~MetricsServer();
  int port() const { return port_; }
  // Replaces the named figures (e.g. {"loss", 3.2}); others keep their last value.
  void publish(const std::map<std::string, double>& figures);
  // The exposition text served at /metrics.
  std::string render() const;

 private:
  MetricsServer() = default;
  void serve();
  int listenFd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::map<std::string, double> figures_;
};

}  // namespace tpc
