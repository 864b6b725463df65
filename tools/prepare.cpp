// `tpc prepare`: tokenizes a .txt or .jsonl corpus into a Megatron indexed dataset (PREFIX.bin + .idx).
#include <cstdio>
#include <iostream>
#include <thread>

#include "frontend/prepare.h"
#include "frontend/tokenizer.h"
#include "tools/cli.h"
#include "tools/output_paths.h"

namespace tpc {
namespace {

int runPrepare(std::vector<std::string> args) {
  cli::Flags flags("prepare",
                   "tpc prepare --input FILE.{txt,jsonl} --tokenizer gpt2|byte --output-prefix PREFIX\n"
                   "                   [--json-key text] [--append-eod] [--workers N]\n\n"
                   "Writes PREFIX.bin and PREFIX.idx in Megatron-LM's indexed dataset layout (MMIDIDX version 1,\n"
                   "uint16 tokens), one document per sequence, as Megatron's preprocess_data.py does.\n"
                   "Input is UTF-8. FILE.txt: each line that is not blank is a document. FILE.jsonl: one JSON object per\n"
                   "line, its --json-key field holds the document's text (write multi-paragraph documents as\n"
                   "JSONL with \\n in the text). Blank lines (spaces and tabs alone) and empty texts are skipped. On any error nothing is\n"
                   "written (output goes to temporary files beside PREFIX, moved into place together at the end);\n"
                   "the error names the line.");
  flags.value("input", "the corpus: FILE.txt or FILE.jsonl")
      .value("tokenizer", "gpt2 (GPT-2 BPE, vocabulary from $TPC_DATA_DIR/gpt2) or byte")
      .value("output-prefix", "write PREFIX.bin and PREFIX.idx")
      .value("json-key", "the JSONL field holding the text", "text")
      .toggle("append-eod", "end every document with the end-of-document id (gpt2: 50256, byte: 256)")
      .value("workers", "tokenizing threads (the output is the same for any number)", "1")
      .toggle("quiet", "no progress or summary");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (!flags.positional().empty())
    return cli::fail("prepare", "unexpected argument '" + flags.positional()[0] + "' (use --input FILE)");
  for (const char* required : {"input", "tokenizer", "output-prefix"})
    if (!flags.has(required)) return cli::fail("prepare", std::string("--") + required + " is required (see --help)");
  auto workers = flags.getInt("workers", 1, 256);
  if (!workers.ok()) return cli::fail("prepare", workers.error());

  PrepareOptions opts;
  opts.input = flags.get("input");
  opts.jsonKey = flags.get("json-key");
  opts.outputPrefix = flags.get("output-prefix");
  // A .txt file is read as text whatever its lines hold: a JSONL corpus named .txt would become documents of raw
  // JSON ('{"text": ...'), so a --json-key given for it says the file is JSONL under the wrong name.
  if (flags.has("json-key") && opts.input.ends_with(".txt"))
    return cli::fail("prepare", cat("--json-key applies to JSONL input, but ", opts.input, " is read as plain text (a "
                                    "document a line); if it holds JSON objects, name it .jsonl"));
  // "data/" would write the hidden files data/.bin and data/.idx: the prefix names the files, not a folder.
  if (opts.outputPrefix.empty() || opts.outputPrefix.back() == '/' || opts.outputPrefix.back() == '.')
    return cli::fail("prepare", cat("--output-prefix '", opts.outputPrefix, "' names no file: give the files' name "
                                    "without .bin/.idx, e.g. --output-prefix data/mycorpus"));
  // A missing or unwritable folder, or a PREFIX.bin that is a folder: said now, naming the flag and the fix, not
  // as a temporary file the user never named (a missing folder) or after all the tokenizing (a folder, at the rename).
  for (const char* ext : {".bin", ".idx"})
    if (Status s = cli::checkOutputFile("--output-prefix", opts.outputPrefix + ext); !s.ok())
      return cli::fail("prepare", s.error());
  opts.appendEod = flags.on("append-eod");
  opts.workers = static_cast<int>(*workers);
  opts.progress = !flags.on("quiet");

  auto tokenizer = loadTokenizer(flags.get("tokenizer"));
  if (!tokenizer.ok()) return cli::fail("prepare", tokenizer.error());
  auto stats = prepareDataset(opts, **tokenizer);
  if (!stats.ok()) return cli::fail("prepare", stats.error());
  if (!flags.on("quiet")) {
    const PrepareStats& s = *stats;
    double secs = s.seconds > 0 ? s.seconds : 1e-9;
    std::printf("tpc prepare: wrote %s.bin and %s.idx: %llu documents, %llu tokens from %.1f MB in %.2f s "
                "(%.1f MB/s, %.0f tokens/s, %d workers)\n",
                opts.outputPrefix.c_str(), opts.outputPrefix.c_str(), (unsigned long long)s.documents,
                (unsigned long long)s.tokens, s.inputBytes / 1e6, s.seconds, s.inputBytes / 1e6 / secs,
                s.tokens / secs, opts.workers);
  }
  return 0;
}

cli::SubcommandRegistration reg("prepare", "tokenize a .txt/.jsonl corpus into a Megatron indexed dataset (.bin/.idx)",
                                runPrepare);

}  // namespace
}  // namespace tpc
