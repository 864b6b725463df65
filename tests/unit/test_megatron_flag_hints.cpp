// What `tpc CMD` says to an unknown option: tpc's name for a Megatron-LM flag (only where the sub-command has
// that flag), where the model's sizes are set instead, and the closest of the sub-command's own flags to a typo.
#include <algorithm>

#include <catch2/catch.hpp>

#include "test_support.h"

namespace tpc {
namespace {

struct Case {
  std::string args, expected;  // expected: stderr's one line after "tpc CMD: error: unknown option "
};

// Runs `tpc ARGS` (M: the tiny model file) for each case: exit 1, nothing on stdout, the expected error line.
template <size_t N>
void runCases(const Case (&cases)[N], const std::string& tiny) {
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

}  // namespace

TEST_CASE("unknown options: Megatron-LM's names and typos get a did-you-mean", "[cli]") {
  const std::string tiny = test::binaryPath("models/tiny.fb");
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
  runCases(cases, tiny);
}

TEST_CASE("unknown options: Megatron-LM's implementation and architecture flags say what tpc does instead",
          "[cli][megatron]") {
  const std::string tiny = test::binaryPath("models/tiny.fb");
  const std::string overlap = ": Megatron-LM's flag is not needed: tpc overlaps its collectives with compute on a "
                              "communication stream by default (--one-stream turns that off); drop it";
  const std::string gpt2 = ": Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: ";
  const std::string finetune = ": to start from a checkpoint's parameters only, give --load DIR --finetune, as in "
                               "Megatron-LM (the AdamW state, step and data order start anew; tpc does not go on from "
                               "the checkpoint's step without its AdamW state); drop it";
  const Case cases[] = {
      {"run M --use-mcore-models",
       "'--use-mcore-models': Megatron-LM's flag is not needed: tpc builds its GPT as a graph of its own (no legacy or "
       "Megatron-Core model to pick); drop it"},
      {"run M --transformer-impl transformer_engine",
       "'--transformer-impl': Megatron-LM's flag is not needed: tpc compiles its own kernels (no Transformer Engine or "
       "local implementation to pick); drop it"},
      {"run M --no-masked-softmax-fusion",
       "'--no-masked-softmax-fusion': Megatron-LM's flag is not needed: tpc's attention is always one fused flash/cuDNN "
       "kernel, mask and softmax inside it; drop it"},
      {"run M --attention-softmax-in-fp32",
       "'--attention-softmax-in-fp32': Megatron-LM's flag is not needed: tpc's attention kernels compute the softmax in "
       "fp32 in every precision; drop it"},
      {"run M --num-workers 2",
       "'--num-workers': Megatron-LM's flag is not needed: tpc reads the memory-mapped dataset in the training process, "
       "with no loader workers; drop it"},
      {"run M --DDP-impl local",
       "'--DDP-impl': Megatron-LM's flag is not needed: tpc's --dp reduces the gradients inside its training step "
       "(collectives in the graph), with no DDP wrapper to pick; drop it"},
      {"run M --overlap-grad-reduce", "'--overlap-grad-reduce'" + overlap},
      {"run M --overlap-param-gather", "'--overlap-param-gather'" + overlap},
      {"run M --accumulate-allreduce-grads-in-fp32",
       "'--accumulate-allreduce-grads-in-fp32': Megatron-LM's flag is not needed: tpc's parameter gradients are always "
       "fp32 (the fp32 master weights'), accumulated and all-reduced in fp32; drop it"},
      {"run M --ckpt-format torch_dist",
       "'--ckpt-format': Megatron-LM's flag is not needed: tpc writes one checkpoint format (iter_N/model.safetensors and "
       "state.json, loadable under any --tp/--dp/--sp; `tpc export --hf` writes a Hugging Face GPT-2); drop it"},
      {"run M --use-checkpoint-args",
       "'--use-checkpoint-args': Megatron-LM's flag is not needed: tpc takes the model's sizes from the model file, and "
       "--load checks the checkpoint against them; drop it"},
      {"run M --log-throughput",
       "'--log-throughput': Megatron-LM's flag is not needed: tpc logs tokens/s (and MFU on a GPU) every --log-interval; "
       "drop it"},
      {"run M --timing-log-level 2",
       "'--timing-log-level': Megatron-LM's flag is not needed: tpc prints its startup times, and --profile-step N times "
       "one step kernel by kernel; drop it"},
      {"run M --log-num-zeros-in-grad",
       "'--log-num-zeros-in-grad': Megatron-LM's flag has no equivalent in tpc, which logs the gradient norm every "
       "--log-interval; drop it"},
      {"run M --log-validation-ppl-to-tensorboard",
       "'--log-validation-ppl-to-tensorboard': Megatron-LM's flag is not needed: tpc logs the validation loss and "
       "perplexity at every evaluation (the console, --log-jsonl, --tensorboard-dir as 'lm loss validation ppl', "
       "--metrics-port); drop it"},
      // The model file has the init std (tpc new has no flag for it): the note points there, with the user's value.
      {"run M --init-method-std 0.006",
       "'--init-method-std': the model file holds Megatron-LM's --init-method-std as arch.init_std (GPT-2's 0.02 by "
       "default): write a .json one with `tpc new gpt --preset NAME -o MODEL.json`, set its arch.init_std to 0.006, and "
       "run that"},
      {"new gpt --init-method-std=0.01",
       "'--init-method-std=0.01': the model file holds Megatron-LM's --init-method-std as arch.init_std (GPT-2's 0.02 by "
       "default): write a .json one with `tpc new gpt --preset NAME -o MODEL.json`, set its arch.init_std to 0.01, and "
       "run that"},
      {"run M --untie-embeddings-and-output-weights",
       "'--untie-embeddings-and-output-weights'" + gpt2 + "the output layer is the word embedding (tied); drop it"},
      {"run M --swiglu", "'--swiglu'" + gpt2 + "a GELU MLP of 4 x hidden; drop it"},
      {"run M --normalization RMSNorm", "'--normalization'" + gpt2 + "LayerNorm; drop it"},
      {"run M --position-embedding-type rope",
       "'--position-embedding-type'" + gpt2 + "learned absolute position embeddings (Megatron-LM's learned_absolute); drop it"},
      {"run M --no-position-embedding", "'--no-position-embedding'" + gpt2 + "learned absolute position embeddings; drop it"},
      {"run M --group-query-attention",
       "'--group-query-attention'" + gpt2 + "multi-head attention, a key and value head per query head; drop it"},
      {"run M --num-query-groups 8",
       "'--num-query-groups'" + gpt2 + "multi-head attention, a key and value head per query head; drop it"},
      // Megatron-LM's way to start from a checkpoint's weights only: tpc's --finetune.
      {"run M --load ck --no-load-optim", "'--no-load-optim'" + finetune},
      {"run M --no_load_rng", "'--no_load_rng'" + finetune},
  };
  runCases(cases, tiny);
}

TEST_CASE("unknown options: all of a command line's are one error, each with its hint", "[cli][megatron]") {
  const std::string tiny = test::binaryPath("models/tiny.fb");
  // A pasted Megatron-LM command: each unknown option's value ("2", "local", "-0.5") is taken as its own, neither a
  // second model file nor an option.
  auto r = test::runCommand(test::tpcBinary() + " run " + tiny + " --use-mcore-models --num-workers 2 --tp 1 "
                            "--tensor-model-parallel-size 2 --lr-warmup-init -0.5 --DDP-impl local --tarin-iters 5");
  INFO(r.err);
  CHECK(r.exitCode == 1);
  CHECK(r.out.empty());
  CHECK(r.err ==
        "tpc run: error: 6 unknown options:\n"
        "  unknown option '--use-mcore-models': Megatron-LM's flag is not needed: tpc builds its GPT as a graph of its own "
        "(no legacy or Megatron-Core model to pick); drop it\n"
        "  unknown option '--num-workers': Megatron-LM's flag is not needed: tpc reads the memory-mapped dataset in the "
        "training process, with no loader workers; drop it\n"
        "  unknown option '--tensor-model-parallel-size'; did you mean --tp 2? (tpc's name for Megatron-LM's "
        "--tensor-model-parallel-size)\n"
        "  unknown option '--lr-warmup-init' (see 'tpc run --help')\n"
        "  unknown option '--DDP-impl': Megatron-LM's flag is not needed: tpc's --dp reduces the gradients inside its "
        "training step (collectives in the graph), with no DDP wrapper to pick; drop it\n"
        "  unknown option '--tarin-iters'; did you mean --train-iters? (see 'tpc run --help')\n");
  // Other bad options join them in the same error.
  auto mixed = test::runCommand(test::tpcBinary() + " run " + tiny + " --zzz --save --quiet --log-interval");
  CHECK(mixed.exitCode == 1);
  CHECK(mixed.err ==
        "tpc run: error: 3 bad options:\n"
        "  unknown option '--zzz' (see 'tpc run --help')\n"
        "  option --save needs a value, but the next argument is the option '--quiet' (write --save=VALUE for a value "
        "that starts with --)\n"
        "  option --log-interval needs a value\n");
  // One unknown option is the one line it always was.
  auto one = test::runCommand(test::tpcBinary() + " run " + tiny + " --num-workers 2");
  CHECK(one.err == "tpc run: error: unknown option '--num-workers': Megatron-LM's flag is not needed: tpc reads the "
                   "memory-mapped dataset in the training process, with no loader workers; drop it\n");
}

}  // namespace tpc

