#include "runtime/evaluator.h"

#include <algorithm>

#include "passes/builtin_passes.h"

namespace tpc {

Result<std::unique_ptr<Evaluator>> Evaluator::create(const Graph& forward, const std::string& lossOutput,
                                                     CpuOptions options) {
  auto e = std::unique_ptr<Evaluator>(new Evaluator());
  e->graph_ = forward.clone();
  TPC_TRY(createInferencePass()->run(*e->graph_).status());
  bool found = false;
  for (size_t i = 0; i < e->graph_->outputs().size(); ++i)
    if (e->graph_->outputName(i) == lossOutput) e->lossIndex_ = i, found = true;
  if (!found) return makeError("evaluation: the forward graph has no output named '", lossOutput, "'");
  TPC_TRY(createDCEPass()->run(*e->graph_).status());
  TPC_ASSIGN(e->exec_, CpuExecutor::create(*e->graph_, options));
  return e;
}

Result<double> Evaluator::meanLoss(const Backend& state, BatchSource& data, int64_t iters) {
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
  HostTensor* tokens = nullptr;
  HostTensor* targets = nullptr;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (graph_->inputs()[i]->name() == "tokens") tokens = &inputs[i];
    if (graph_->inputs()[i]->name() == "targets") targets = &inputs[i];
  }
  if (!tokens || !targets || tokens->type().rank() != 2 || tokens->dtype() != DType::i32 ||
      targets->type() != tokens->type())
    return makeError("evaluation needs inputs tokens and targets, both i32[batch, seq]");
  std::vector<const HostTensor*> in;
  for (const HostTensor& t : inputs) in.push_back(&t);
  double sum = 0;
  for (int64_t i = 0; i < iters; ++i) {
    TPC_TRY(data.next(tokens->data<int32_t>(), targets->data<int32_t>(), tokens->shape()[0], tokens->shape()[1]));
    TPC_ASSIGN(auto out, exec_->run(in, ps, 0));
    sum += out[lossIndex_].getAsDouble(0);
  }
  return sum / static_cast<double>(iters);
}

}  // namespace tpc
