// `tpc export --hf OUT CHECKPOINT`: a checkpoint's weights in the Hugging Face GPT-2 layout, loadable by
// transformers' GPT2LMHeadModel.from_pretrained(OUT).
#include <iostream>

#include "frontend/model_file.h"
#include "models/gpt.h"
#include "runtime/checkpoint.h"
#include "tools/cli.h"
#include "tools/hf_gpt2.h"

namespace tpc {
namespace {

int runExport(std::vector<std::string> args) {
  cli::Flags flags("export",
                   "tpc export --hf OUT CHECKPOINT\n\n"
                   "Writes OUT/config.json and OUT/model.safetensors (GPT2LMHeadModel) from the parameters of CHECKPOINT\n"
                   "(a --save directory, whose latest checkpoint is used, or one of its iter_N directories).");
  flags.value("hf", "the Hugging Face model directory to write");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (!flags.has("hf")) return cli::fail("export", "--hf OUT is required (the only export format so far)");
  if (flags.positional().size() != 1) return cli::fail("export", "expected one checkpoint directory");
  auto out = hfOutputDir(flags.get("hf"));
  if (!out) return cli::fail("export", out.error());
  auto ck = loadCheckpoint(flags.positional()[0]);
  if (!ck) return cli::fail("export", ck.error());
  auto model = loadModelFile(ck->path + "/model.fb");
  if (!model) return cli::fail("export", model.error());
  if (!model->gpt) return cli::fail("export", ck->path + "/model.fb: error: not a GPT model; --hf exports GPT-2 models");
  std::map<std::string, HostTensor> params;
  int64_t count = 0;
  for (const Value* p : model->forward->params()) {
    Shape layout = gptStoredShape(*model->gpt, p->name(), p->shape());
    auto t = checkpointTensor(*ck, p->name(), layout, TensorType(DType::f32, layout));
    if (!t) return cli::fail("export", t.error());
    // A diverged run's weights: transformers would load them and compute NaN logits.
    if (Status s = requireFiniteWeights(*t, ck->path + "/model.safetensors", p->name(),
                                        "a model with non-finite weights is not exported (export an earlier iter_N "
                                        "folder of the checkpoint, from before the run diverged)");
        !s.ok())
      return cli::fail("export", s.error());
    count += t->numel();
    params[p->name()] = std::move(*t);
  }
  if (Status s = writeHfGpt2(*out, *model->gpt, model->config.tokenizer, params); !s.ok()) return cli::fail("export", s.error());
  std::cout << "wrote " << *out << "/config.json and " << *out << "/model.safetensors: " << params.size() << " tensors, "
            << count << " parameters from " << ck->path << " (iteration " << ck->state.iteration << ")\n";
  return 0;
}

cli::SubcommandRegistration reg("export", "write a checkpoint's weights as a Hugging Face GPT-2 model", runExport);

}  // namespace
}  // namespace tpc
