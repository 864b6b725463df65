#include "runtime/evaluator.h"

#include <algorithm>

#include "passes/builtin_passes.h"
#include "passes/pipeline.h"

namespace tpc {

Result<std::unique_ptr<Evaluator>> Evaluator::inferenceGraph(const Graph& forward, const std::string& lossOutput,
                                                             const std::string& passes) {
  auto e = std::unique_ptr<Evaluator>(new Evaluator());
  e->graph_ = forward.clone();
  TPC_TRY(createInferencePass()->run(*e->graph_).status());
  if (!passes.empty()) {
    PassManager pm;
    TPC_TRY(pm.addPipeline(passes, ""));  // tpc's own (evaluationPipeline), not a user's text
    TPC_TRY(pm.run(*e->graph_));
  }
  bool found = false;
  for (size_t i = 0; i < e->graph_->outputs().size(); ++i)
    if (e->graph_->outputName(i) == lossOutput) e->lossIndex_ = i, found = true;
  if (!found) return makeError("evaluation: the forward graph has no output named '", lossOutput, "'");
  // The loss alone: other outputs (logits) would cost device memory and copies for nothing.
  Value* loss = e->graph_->outputs()[e->lossIndex_].value;
  e->graph_->clearOutputs();
  e->graph_->addOutput(loss, lossOutput);
  e->lossIndex_ = 0;
  TPC_TRY(createDCEPass()->run(*e->graph_).status());
  const Value *tokens = nullptr, *targets = nullptr;
  for (const Value* v : e->graph_->inputs()) {
    if (v->name() == "tokens") tokens = v;
    if (v->name() == "targets") targets = v;
  }
  if (!tokens || !targets || tokens->type().rank() != 2 || tokens->dtype() != DType::i32 ||
      targets->type() != tokens->type())
    return makeError("evaluation needs inputs tokens and targets, both i32[batch, seq]");
  return e;
}

Result<std::unique_ptr<Evaluator>> Evaluator::create(const Graph& forward, const std::string& lossOutput,
                                                     CpuOptions options) {
  TPC_ASSIGN(auto e, inferenceGraph(forward, lossOutput, ""));
  TPC_ASSIGN(e->exec_, CpuExecutor::create(*e->graph_, options));
  return e;
}

Result<std::unique_ptr<Evaluator>> Evaluator::create(const Graph& forward, const std::string& lossOutput,
                                                     std::unique_ptr<Backend> device, const std::string& passes,
                                                     const Backend& training) {
  auto given = std::make_shared<std::unique_ptr<Backend>>(std::move(device));
  return create(forward, lossOutput, [given](Graph&) -> Result<std::unique_ptr<Backend>> { return std::move(*given); },
                passes, training);
}

Result<std::unique_ptr<Evaluator>> Evaluator::create(const Graph& forward, const std::string& lossOutput,
                                                     const BackendFactory& makeBackend, const std::string& passes,
                                                     const Backend& /*training: read at each evaluation*/) {
  TPC_ASSIGN(auto e, inferenceGraph(forward, lossOutput, passes));
  TPC_ASSIGN(std::unique_ptr<Backend> device, makeBackend(*e->graph_));
  if (!device) return makeError("evaluation: no backend to run on");
  // Zeros, not the training's values: every evaluation takes the parameters from `training` first
  // (deviceMeanLoss; nothing to take where the backend reads the training's buffers), and reading them here
  // cost a device-to-host and a host-to-device copy of the whole model (6.7 s of a warm gpt2-xl start on an H100).
  TensorMap state;
  for (const Value* p : e->graph_->params()) state[p->name()] = HostTensor(p->type());
  TPC_TRY(device->prepare(*e->graph_, state));
  e->device_ = std::move(device);
  return e;
}

std::string Evaluator::where() const { return device_ ? device_->name() : "cpu executor"; }

// Fills the graph's tokens and targets from `data`; other inputs stay zero.
static Status nextBatch(BatchSource& data, std::vector<HostTensor>& inputs, const Graph& g) {
  HostTensor *tokens = nullptr, *targets = nullptr;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (g.inputs()[i]->name() == "tokens") tokens = &inputs[i];
    if (g.inputs()[i]->name() == "targets") targets = &inputs[i];
  }
  if (!tokens || !targets) return makeError("evaluation needs inputs tokens and targets, both i32[batch, seq]");
  return data.next(tokens->data<int32_t>(), targets->data<int32_t>(), tokens->shape()[0], tokens->shape()[1]);
}

Result<double> Evaluator::meanLoss(const Backend& state, BatchSource& data, int64_t iters) {
  if (device_) return deviceMeanLoss(state, data, iters);
  std::vector<HostTensor> params;
  for (const Value* p : graph_->params()) {
    TPC_ASSIGN(HostTensor t, state.readState(p->name()));
    t = t.convertTo(p->dtype());
    // The training step may view a tensor in another shape of the same bytes (tp's QKV as [D, 3, D]).
    if (t.numel() != p->type().numel())
      return makeError("evaluation: parameter ", p->name(), " is ", t.type().str(), " in training, ", p->type().str(),
                       " in the forward graph");
    HostTensor laid(p->type());
    std::copy(t.raw(), t.raw() + t.bytes(), laid.raw());
    params.push_back(std::move(laid));
  }
  std::vector<const HostTensor*> ps;
  for (const HostTensor& t : params) ps.push_back(&t);
  std::vector<HostTensor> inputs;
  for (const Value* v : graph_->inputs()) inputs.emplace_back(v->type());
  std::vector<const HostTensor*> in;
  for (const HostTensor& t : inputs) in.push_back(&t);
  double sum = 0;
  for (int64_t i = 0; i < iters; ++i) {
    TPC_TRY(nextBatch(data, inputs, *graph_));
    TPC_ASSIGN(auto out, exec_->run(in, ps, 0));
    sum += out[lossIndex_].getAsDouble(0);
  }
  return sum / static_cast<double>(iters);
}

Result<double> Evaluator::deviceMeanLoss(const Backend& state, BatchSource& data, int64_t iters) {
  for (const Value* p : graph_->params()) TPC_TRY(device_->copyStateFrom(state, p->name()));
  std::vector<HostTensor> inputs;
  for (const Value* v : graph_->inputs()) inputs.emplace_back(v->type());
  double sum = 0;
  for (int64_t i = 0; i < iters; ++i) {
    TPC_TRY(nextBatch(data, inputs, *graph_));
    TensorMap in;
    for (size_t k = 0; k < inputs.size(); ++k) in[graph_->inputs()[k]->name()] = inputs[k];
    // Dropout is off, so the step index keys nothing; a fresh one per call all the same.
    TPC_ASSIGN(TensorMap out, device_->step(in, ++calls_));
    auto it = out.find(graph_->outputName(lossIndex_));
    if (it == out.end()) return makeError("evaluation: backend ", device_->name(), " returned no loss");
    sum += it->second.getAsDouble(0);
  }
  return sum / static_cast<double>(iters);
}

}  // namespace tpc
