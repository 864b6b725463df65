// What `tpc CMD` says to an unknown option: tpc's name for a Megatron-LM flag (only where the sub-command has
// that flag), where the model's sizes are set instead, and the closest of the sub-command's own flags to a typo.
#include <algorithm>

#include <catch2/catch.hpp>

#include "test_support.h"

namespace tpc {

TEST_CASE("unknown options: Megatron-LM's names and typos get a did-you-mean", "[cli]") {
  const std::string tiny = test::binaryPath("models/tiny.fb");
  struct Case {
    std::string args, expected;  // expected: stderr's one line after "tpc CMD: error: unknown option "
  };
  const Case cases[] = {
      {"run M --tensor-model-parallel-size 2",
       "'--tensor-model-parallel-size'; did you mean --tp 2? (tpc's name for Megatron-LM's --tensor-model-parallel-size)"},
      {"run M --tensor_model_parallel_size=4",
       "'--tensor_model_parallel_size=4'; did you mean --tp 4? (tpc's name for Megatron-LM's --tensor-model-parallel-size)"},
      {"dump M --data-parallel-size 2", "'--data-parallel-size'; did you mean --dp 2? (tpc's name for Megatron-LM's --data-parallel-size)"},
      // A toggle: the word after it is the model, not its value.
      {"run --sequence-parallel M", "'--sequence-parallel'; did you mean --sp? (tpc's name for Megatron-LM's --sequence-parallel)"},
      {"run M --recompute-activations",
       "'--recompute-activations'; did you mean --recompute selective? (tpc's name for Megatron-LM's --recompute-activations)"},
      {"run M --recompute-granularity full",
       "'--recompute-granularity'; did you mean --recompute full? (tpc's name for Megatron-LM's --recompute-granularity)"},
      {"run M --use-flash-attn",
       "'--use-flash-attn': Megatron-LM's flag is not needed: tpc's attention is always one fused flash/cuDNN kernel; drop it"},
      {"run M --ffn-hidden-size 3072",
       "'--ffn-hidden-size': Megatron-LM's flag has no equivalent in tpc, whose GPT has an MLP of 4 x hidden (as GPT-2's)"},
      {"run M --num-layers 24",
       "'--num-layers': the model file holds Megatron-LM's --num-layers; write one with `tpc new gpt --preset NAME --layers 24 "
       "-o MODEL.fb`"},
      {"dump M --num-attention-heads=16",
       "'--num-attention-heads=16': the model file holds Megatron-LM's --num-attention-heads; write one with `tpc new gpt "
       "--preset NAME --heads 16 -o MODEL.fb`"},
      // tpc new has the model's flags (and --seq for the sequence).
      {"new gpt --num-layers 24", "'--num-layers'; did you mean --layers 24? (tpc's name for Megatron-LM's --num-layers)"},
      {"new gpt --hidden-size 1024", "'--hidden-size'; did you mean --hidden 1024? (tpc's name for Megatron-LM's --hidden-size)"},
      {"new gpt --max-position-embeddings 2048",
       "'--max-position-embeddings'; did you mean --positions 2048? (tpc's name for Megatron-LM's --max-position-embeddings)"},
      {"new gpt --vocab-size 50257", "'--vocab-size'; did you mean --vocab 50257? (tpc's name for Megatron-LM's --vocab-size)"},
      {"new gpt --seq-length 128", "'--seq-length'; did you mean --seq 128? (tpc's name for Megatron-LM's --seq-length)"},
      // tools/preprocess_data.py's flags met by tpc prepare.
      {"prepare --json-keys content",
       "'--json-keys'; did you mean --json-key content? (tpc's name for Megatron-LM's --json-keys; one key, whose documents "
       "go to PREFIX.bin/.idx (Megatron-LM names them PREFIX_KEY_document))"},
      {"prepare --tokenizer-type GPT2BPETokenizer",
       "'--tokenizer-type'; did you mean --tokenizer gpt2? (tpc's name for Megatron-LM's --tokenizer-type; its "
       "GPT2BPETokenizer is tpc's gpt2, the other is byte)"},
      {"tokenize --vocab-file gpt2-vocab.json",
       "'--vocab-file': Megatron-LM's flag is not needed: tpc reads the GPT-2 vocabulary and merges from "
       "$TPC_DATA_DIR/gpt2 (encoder.json, vocab.bpe; scripts/fetch_data.sh fetches them); drop it"},
      {"prepare --merge-file gpt2-merges.txt",
       "'--merge-file': Megatron-LM's flag is not needed: tpc reads the GPT-2 vocabulary and merges from "
       "$TPC_DATA_DIR/gpt2 (encoder.json, vocab.bpe; scripts/fetch_data.sh fetches them); drop it"},
      {"prepare --dataset-impl mmap",
       "'--dataset-impl': Megatron-LM's flag is not needed: tpc writes and reads only the mmap indexed dataset (MMIDIDX); "
       "drop it"},
      {"prepare --split-sentences",
       "'--split-sentences': Megatron-LM's flag has no equivalent in tpc: a document is one line of text or one JSONL "
       "record, never split"},
      // tpc sample has no --tp: nothing to suggest there.
      {"sample --tensor-model-parallel-size 2", "'--tensor-model-parallel-size' (see 'tpc sample --help')"},
      // Typos and abbreviations of the sub-command's own flags.
      {"run M --train-iter 5", "'--train-iter'; did you mean --train-iters? (see 'tpc run --help')"},
      {"run M --tarin-iters 5", "'--tarin-iters'; did you mean --train-iters? (see 'tpc run --help')"},
      {"run M --micro-batch 4", "'--micro-batch'; did you mean --micro-batch-size? (see 'tpc run --help')"},
      {"run M --hlep", "'--hlep'; did you mean --help? (see 'tpc run --help')"},
      {"run M --zzz", "'--zzz' (see 'tpc run --help')"},
  };
  for (const Case& c : cases) {
    std::string args = c.args;
    if (size_t m = args.find(" M"); m != std::string::npos) args.replace(m, 2, " " + tiny);
    const std::string cmd = args.substr(0, args.find(' '));
    auto r = test::runCommand(test::tpcBinary() + " " + args);
    INFO("tpc " << args << "\nstderr: " << r.err);
    CHECK(r.exitCode == 1);
    CHECK(r.out.empty());
    CHECK(r.err == "tpc " + cmd + ": error: unknown option " + c.expected + "\n");
  }
}

}  // namespace tpc
