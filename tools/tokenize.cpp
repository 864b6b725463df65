// `tpc tokenize`: text on stdin to token ids on stdout, or ids back to text with --decode.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/tokenizer.h"
#include "tools/cli.h"

namespace tpc {
namespace {

int runTokenize(std::vector<std::string> args) {
  cli::Flags flags("tokenize",
                   "tpc tokenize [--tokenizer gpt2|byte] [--decode] < INPUT\n\n"
                   "Reads UTF-8 text on standard input and prints its token ids, space separated, on one line.\n"
                   "With --decode, reads whitespace-separated ids and prints the text they stand for.\n"
                   "The end-of-document id (gpt2: 50256, byte: 256) decodes to <|endoftext|>, but that text in the\n"
                   "input is tokenized as text, as Megatron-LM's GPT2 tokenizer and tpc prepare do: documents are\n"
                   "separated by the id itself, never by text a document may happen to contain.\n"
                   "The gpt2 vocabulary is read from $TPC_DATA_DIR/gpt2 (scripts/fetch_data.sh fetches it).");
  flags.value("tokenizer", "gpt2 (GPT-2 byte-level BPE) or byte (256 bytes + end-of-document id 256)", "gpt2")
      .toggle("decode", "ids on stdin to text on stdout");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (!flags.positional().empty())
    return cli::fail("tokenize", "unexpected argument '" + flags.positional()[0] + "' (the input is read from stdin)");
  auto tokenizer = loadTokenizer(flags.get("tokenizer"));
  if (!tokenizer.ok()) return cli::fail("tokenize", tokenizer.error());

  // A directory on stdin reads as nothing (EISDIR): say so rather than print an empty line.
  struct stat st {};
  if (fstat(0, &st) == 0 && S_ISDIR(st.st_mode))
    return cli::fail("tokenize", "stdin is a directory: give a file (tpc tokenize < FILE)");
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad() || std::ferror(stdin)) return cli::fail("tokenize", "cannot read stdin");
  if (flags.on("decode")) {
    std::vector<int32_t> ids;
    std::istringstream in(input);
    std::string word;
    while (in >> word) {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(word.c_str(), &end, 10);
      if (*end != '\0' || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
        return cli::fail("tokenize", "stdin: '" + word + "' is not a token id");
      ids.push_back(static_cast<int32_t>(v));
    }
    std::string text;
    if (Status s = (*tokenizer)->decode(ids, text); !s.ok()) return cli::fail("tokenize", "stdin: " + s.error());
    std::cout << text;
    std::cout.flush();
    return std::cout ? 0 : cli::fail("tokenize", "cannot write to stdout");
  }
  std::vector<int32_t> ids;
  if (Status s = (*tokenizer)->encode(input, ids); !s.ok()) return cli::fail("tokenize", "stdin: " + s.error());
  std::string out;
  out.reserve(ids.size() * 6);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  out += '\n';
  std::cout << out;
  std::cout.flush();
  return std::cout ? 0 : cli::fail("tokenize", "cannot write to stdout");
}

cli::SubcommandRegistration reg("tokenize", "text to GPT-2 or byte token ids and back (--decode)", runTokenize);

}  // namespace
}  // namespace tpc
