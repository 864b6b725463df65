// The Hugging Face GPT-2 layout (transformers' GPT2LMHeadModel): config.json and model.safetensors.
// tpc's GPT parameter names are Hugging Face's without the `transformer.` prefix and `.weight` of the two
// embeddings; Conv1D weights are stored [in, out], as tpc's x @ W uses them, so no tensor is transposed.
// The embedding is stored with the real vocabulary (vocab_size rows), the LM head tied to it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "frontend/architecture.h"
#include "ir/status.h"
#include "runtime/host_tensor.h"

namespace tpc {

// "wte" -> "transformer.wte.weight", "h.0.ln_1.weight" -> "transformer.h.0.ln_1.weight".
std::string hfNameOf(const std::string& tpcName);
// The reverse; accepts names with or without "transformer."; "" for tensors tpc does not keep
// (attn.bias / attn.masked_bias buffers, the tied lm_head.weight).
std::string tpcNameOfHf(const std::string& hfName);

// `tokenizer`: the model's tokenizer_type, whose end-of-document id is bos_token_id and eos_token_id.
std::string hfConfigJson(const GptConfig& gpt, const std::string& tokenizer);
// Parses DIR/config.json (`path` for messages): a GPT-2 or an error naming the field. A field it lacks takes
// transformers' GPT2Config default (n_positions 1024, n_embd 768, ...); `defaulted`, when given, gets
// "field=default" for each of those.
Result<GptConfig> parseHfConfig(const std::string& path, const std::string& json,
                                std::vector<std::string>* defaulted = nullptr);

// The directory writeHfGpt2 would write for `path` (trailing slashes dropped), or an error when it cannot:
// empty, '.', or an existing file or folder that is not a Hugging Face model directory.
Result<std::string> hfOutputDir(const std::string& path);
// Writes DIR/config.json and DIR/model.safetensors from tensors named as tpc names them (unsharded; the
// embedding with its real vocab rows). Written into DIR.tmp, then renamed: nothing half-written, and no
// folder it created left behind on failure.
Status writeHfGpt2(const std::string& dir, const GptConfig& gpt, const std::string& tokenizer,
                   const std::map<std::string, HostTensor>& params);
struct HfGpt2 {
  GptConfig gpt;
  std::map<std::string, HostTensor> tensors;   // by tpc name, as f32
  std::map<std::string, std::string> hfNames;  // tpc name -> the tensor's name in model.safetensors, for messages
  std::vector<std::string> defaults;           // "field=default" for each field config.json lacks
  std::map<std::string, int64_t> endIds;       // bos_token_id and eos_token_id, where config.json gives them
};
// The end-of-document id of tpc's tokenizer `tokenizer` (gpt2: <|endoftext|> 50256; byte: 256), which the export
// writes as bos_token_id and eos_token_id.
int64_t hfEndOfDocumentId(const std::string& tokenizer);
// Reads a Hugging Face GPT-2 directory: its config and every tensor (all but the buffers and the tied head).
Result<HfGpt2> readHfGpt2(const std::string& dir);

}  // namespace tpc
