// Training checkpoints (Megatron's --save/--load): DIR/iter_0000042/{model.safetensors, state.json} and
// DIR/latest_checkpointed_iteration.txt. Tensors are stored in their UNSHARDED layout (the model's own
// parameter shapes, AdamW moments alongside as NAME.adam_m / NAME.adam_v), so a checkpoint written under
// one tp/dp/sp loads under any other: the backend slices the state per the new placements.
// Writes go to DIR/.tmp.iter_N and are renamed into place only when complete; `latest` moves last. A
// save killed halfway leaves the previous checkpoint as the latest, and the next save sweeps the debris.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ir/file_io.h"
#include "ir/status.h"
#include "runtime/safetensors.h"

namespace tpc {

struct CheckpointState {
  int64_t iteration = 0;      // optimizer steps completed
  uint64_t dataPosition = 0;  // training windows consumed (TokenWindows::position)
  // With a blend of datasets, the windows each has given (BlendedWindows::takenAt), so that a resume needs no
  // replay of the blending order. Empty with one dataset, and in checkpoints written before it existed.
  std::vector<uint64_t> dataTaken;
  uint64_t seed = 0;          // init, data order and dropout seed of the run
  int64_t skippedSteps = 0;   // non-finite steps dropped (Adam's step is iteration - skippedSteps)
  double lossScale = 0;       // the dynamic loss scale (fp16); 0: the run had none
  int64_t lossScaleGoodSteps = 0;  // finite steps since the scale last changed
  int64_t lossScaleHysteresisLeft = -1;  // overflows before the scale's next halving; -1: not saved (older checkpoints)
  std::string model;          // the model file trained, for the reader's information
  std::string config;         // a one-line summary of the run's config (tp, dp, batch, lr, ...)
  // The settings a resumed run is compared against (flag name -> value as text: lr, its schedule, seq-length,
  // precision, ...), so that a resume under other values says so. Empty in checkpoints written before it existed.
  std::map<std::string, std::string> settings;
};

struct CheckpointTensor {
  std::string name;
  Shape shape;  // the unsharded layout it is stored in; fewer leading rows than the tensor: only those
                // (the embedding's real vocabulary, without this run's padding rows)
};

// Saves `tensors` (read through `read`, which returns each one unsharded; it is reshaped to `shape`),
// `state` and `extraFiles` (name -> bytes; the model file, so that a checkpoint is self-contained) as
// DIR/iter_<iteration>; then keeps only `keep` checkpoints (0: all): this one and the newest keep - 1 others.
Status saveCheckpoint(const std::string& dir, const CheckpointState& state, const std::vector<CheckpointTensor>& tensors,
                      const std::function<Result<HostTensor>(const std::string&)>& read, int64_t keep,
                      const std::map<std::string, std::string>& extraFiles = {});

// The same checkpoint (without pruning) written to temporaries of `commit` in the existing folder DIR: DIR/iter_N
// and DIR's latest file replace the old ones together with the commit's other files (an imported model file), so
// that a failure between them leaves the old pair.
Status stageCheckpoint(FileCommit& commit, const std::string& dir, const CheckpointState& state,
                       const std::vector<CheckpointTensor>& tensors,
                       const std::function<Result<HostTensor>(const std::string&)>& read,
                       const std::map<std::string, std::string>& extraFiles);

struct LoadedCheckpoint {
  std::string path;  // DIR/iter_N
  CheckpointState state;
  SafetensorsFile tensors;
};

// The state.json text of a checkpoint, parsed; errors name `path`. (Exposed for the fuzzer.)
Result<CheckpointState> parseCheckpointState(const std::string& text, const std::string& path);

// Loads the checkpoint DIR's `latest` file names (or DIR itself when it is an iter_N directory).
Result<LoadedCheckpoint> loadCheckpoint(const std::string& dir);

// Whether an entry named `name` at the top of a --save folder is the checkpoints' own, which saves replace or delete:
// the latest-iteration file, iter_* folders (and what they hold) and the .tmp.* folders of saves in progress.
bool ownedBySave(const std::string& name);

// What in `dir` shows that it holds checkpoints (its latest-iteration file, else its newest iter_N folder); empty
// when nothing does.
std::string checkpointHeldIn(const std::string& dir);

// The tensor `name` of a loaded checkpoint as `want`: stored in the unsharded layout `layout` (e.g. [D, 3D]
// for a QKV weight the graph views as [D, 3, D]; [vocab, D] for an embedding `want`s as [padded, D], the
// padding rows then zero). Errors name the checkpoint, the tensor and both shapes.
Result<HostTensor> checkpointTensor(const LoadedCheckpoint& ckpt, const std::string& name, const Shape& layout,
                                    const TensorType& want);

// Weights read from `file` (an f32 tensor `name`): an error naming the file, the tensor and its first NaN or infinity,
// then `consequence` (what cannot be done with it, and the fix); none when every element is finite.
Status requireFiniteWeights(const HostTensor& t, const std::string& file, const std::string& name,
                            std::string_view consequence);

}  // namespace tpc
