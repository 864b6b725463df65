// The fork/join points of the communication stream (comm_stream_schedule.h).
#include "runtime/cuda/comm_stream_schedule.h"

namespace tpc::cuda {

namespace {

bool overlaps(const ByteRange& a, const ByteRange& b) { return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end; }

bool anyOverlap(llvm::ArrayRef<ByteRange> a, llvm::ArrayRef<ByteRange> b) {
  for (const ByteRange& x : a)
    for (const ByteRange& y : b)
      if (overlaps(x, y)) return true;
  return false;
}

}  // namespace

CommSchedule scheduleCommStream(llvm::ArrayRef<ScheduledLaunch> launches) {
  CommSchedule s;
  s.collectiveOf.assign(launches.size(), -1);
  s.joinBefore.assign(launches.size(), -1);
  struct Touched {
    std::vector<ByteRange> reads, writes;
  };
  std::vector<Touched> touched;  // per collective: what its launches read and write
  int joined = -1;               // every collective up to this one is complete on the compute stream
  bool computeSinceFork = true;  // the communication stream has not waited for the compute stream yet
  for (size_t i = 0; i < launches.size(); ++i) {
    const ScheduledLaunch& l = launches[i];
    if (l.collective >= 0) {
      bool starts = i == 0 || launches[i - 1].collective != l.collective;
      if (starts) {
        s.collectives.push_back({i, i, computeSinceFork});
        s.forks += computeSinceFork;
        computeSinceFork = false;
        touched.emplace_back();
      }
      s.collectives.back().last = i;
      s.collectiveOf[i] = static_cast<int>(s.collectives.size()) - 1;
      touched.back().reads.insert(touched.back().reads.end(), l.reads.begin(), l.reads.end());
      touched.back().writes.insert(touched.back().writes.end(), l.writes.begin(), l.writes.end());
      continue;
    }
    computeSinceFork = true;
    // The latest collective still in flight that this launch conflicts with: waiting for it covers the
    // earlier ones too.
    for (int c = static_cast<int>(touched.size()) - 1; c > joined; --c) {
      const Touched& t = touched[static_cast<size_t>(c)];
      if (anyOverlap(l.reads, t.writes) || anyOverlap(l.writes, t.writes) || anyOverlap(l.writes, t.reads)) {
        s.joinBefore[i] = c;
        joined = c;
        ++s.joins;
        break;
      }
    }
    if (joined + 1 < static_cast<int>(touched.size())) ++s.overlapped;
  }
  if (joined + 1 < static_cast<int>(touched.size())) {
    s.joinAtEnd = static_cast<int>(touched.size()) - 1;
    ++s.joins;
  }
  return s;
}

}  // namespace tpc::cuda
