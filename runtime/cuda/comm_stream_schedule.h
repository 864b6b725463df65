// Where a captured step's collectives leave the compute stream and where it waits for them again: each
// collective runs on a communication stream, forked off the compute stream just before it and joined back
// just before the first later launch that conflicts with it (reads what it writes, or writes what it reads
// or writes), or at the step's end; compute in between overlaps it. Pure: no CUDA, byte ranges only.
#pragma once

#include <cstdint>
#include <vector>

#include "llvm/ADT/ArrayRef.h"

namespace tpc::cuda {

struct ByteRange {
  uintptr_t begin = 0, end = 0;  // [begin, end); empty ranges touch nothing
};

struct ScheduledLaunch {
  // >= 0: a launch of a collective (all launches of one collective are consecutive and share the id; two
  // collectives next to each other have different ids); -1: compute.
  int collective = -1;
  std::vector<ByteRange> reads, writes;
};

struct CommSchedule {
  struct Collective {
    size_t first = 0, last = 0;  // its launches [first, last], on the communication stream
    // An event recorded on the compute stream before `first` that the communication stream waits on; false
    // when nothing ran on the compute stream since the previous collective's fork (it is ordered already).
    bool fork = true;
  };
  std::vector<Collective> collectives;  // in launch order; an event is recorded after each one's `last`
  std::vector<int> collectiveOf;        // per launch: its collective (index into `collectives`), or -1
  // Per launch: >= 0: the compute stream waits for that collective's event before the launch (and so for
  // every earlier collective: the communication stream runs them in order).
  std::vector<int> joinBefore;
  int joinAtEnd = -1;       // the collective the compute stream waits for after the last launch, or -1
  int64_t forks = 0, joins = 0;
  int64_t overlapped = 0;   // compute launches issued while some collective may still run
};

CommSchedule scheduleCommStream(llvm::ArrayRef<ScheduledLaunch> launches);

}  // namespace tpc::cuda
