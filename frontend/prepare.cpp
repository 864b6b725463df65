// Data preparation: the input is read in batches of whole lines, batches are tokenized by a pool of
// threads, and the writer consumes them in input order, so the output is the same for any worker count.
#include "frontend/prepare.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "frontend/dataset_writer.h"
#include "frontend/indexed_dataset.h"
#include "frontend/progress_meter.h"
#include "frontend/unicode_classes.h"

namespace tpc {
namespace {

enum class InputFormat { Text, Jsonl };

constexpr size_t kBatchBytes = 512 * 1024;

struct Batch {
  uint64_t firstLine = 1;  // 1-based line number of the batch's first line
  std::string text;        // whole lines
  // Results, written by one worker, read by the writer after `done`.
  std::vector<int32_t> tokens;
  std::vector<uint32_t> docLengths;
  std::optional<Error> error;
  bool done = false;
};

// Reads the input in batches that end on a line break (a line longer than a batch makes a larger one).
class LineBatchReader {
 public:
  static Result<LineBatchReader> open(const std::string& path) {
    LineBatchReader r;
    r.path_ = path;
    r.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (r.fd_ < 0) return makeError("cannot open ", path, ": ", std::strerror(errno));
    struct stat st;
    if (fstat(r.fd_, &st) != 0 || !S_ISREG(st.st_mode)) return makeError(path, " is not a regular file");
    r.size_ = static_cast<uint64_t>(st.st_size);
    return r;
  }
  LineBatchReader(LineBatchReader&& o) noexcept
      : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), size_(o.size_), carry_(std::move(o.carry_)),
        nextLine_(o.nextLine_), eof_(o.eof_) {}
  ~LineBatchReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t size() const { return size_; }
  bool more() const { return !eof_ || !carry_.empty(); }

  Result<std::unique_ptr<Batch>> next() {
    auto batch = std::make_unique<Batch>();
    batch->firstLine = nextLine_;
    std::string buf = std::move(carry_);
    carry_.clear();
    size_t lastBreak = std::string::npos;
    size_t scanned = buf.size();  // the carried-over part is one unfinished line: no line break in it
    while (!eof_ && (buf.size() < kBatchBytes || lastBreak == std::string::npos)) {
      size_t old = buf.size();
      buf.resize(old + kBatchBytes);
      ssize_t n;
      do {
        n = ::read(fd_, buf.data() + old, kBatchBytes);
      } while (n < 0 && errno == EINTR);
      if (n < 0) return makeError("cannot read ", path_, ": ", std::strerror(errno));
      buf.resize(old + static_cast<size_t>(n));
      eof_ = n == 0;
      for (size_t i = buf.size(); i > scanned; --i)
        if (buf[i - 1] == '\n') {
          lastBreak = i - 1;
          break;
        }
      scanned = buf.size();
    }
    if (!eof_) {  // keep the unfinished last line for the next batch
      carry_.assign(buf, lastBreak + 1);
      buf.resize(lastBreak + 1);
    }
    nextLine_ += static_cast<uint64_t>(std::count(buf.begin(), buf.end(), '\n'));
    batch->text = std::move(buf);
    return batch;
  }

 private:
  LineBatchReader() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string carry_;
  uint64_t nextLine_ = 1;
  bool eof_ = false;
};

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1, " preamble.
std::string jsonReason(const std::string& what) {
  std::string s = what;
  if (size_t p = s.find("] "); p != std::string::npos) s = s.substr(p + 2);
  if (size_t p = s.find("column "); p != std::string::npos) s = s.substr(p);
  // nlohmann quotes the whole token it last read: of an unclosed string, the rest of the line (megabytes). Its last
  // 40 bytes say where the parse stopped.
  const std::string lastRead = "; last read: '";
  if (size_t p = s.find(lastRead); p != std::string::npos) {
    const size_t from = p + lastRead.size(), end = s.size() - (s.back() == '\'' ? 1 : 0);
    if (end > from + 40) {
      size_t cut = end - 40;
      while (cut < end && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) ++cut;  // not inside a UTF-8 character
      s = s.substr(0, from) + "..." + s.substr(cut);
    }
  }
  return s;
}

// Python's json.loads, which Megatron-LM's preprocess_data.py reads JSONL with, takes NaN, Infinity and -Infinity
// as numbers; nlohmann does not. `line` with each of them outside a string written as 0 padded with spaces to its
// length (the columns of a later parse error stay right); "" when it has none. -NaN is left for the parser to
// refuse, as Python does.
std::string withNonFiniteAsZero(std::string_view line) {
  std::string out;
  bool inString = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (inString) {
      if (c == '\\') ++i;
      else if (c == '"') inString = false;
      continue;
    }
    if (c == '"') inString = true;
    const std::string_view rest = line.substr(i);
    const bool minus = i > 0 && line[i - 1] == '-';
    const size_t n = rest.starts_with("Infinity") ? 8 : rest.starts_with("NaN") && !minus ? 3 : 0;
    if (n == 0) continue;
    if (out.empty()) out = line;
    out.replace(i, n, "0" + std::string(n - 1, ' '));
    i += n - 1;
  }
  return out;
}

const char* jsonTypeName(const nlohmann::json& j) {
  return j.type_name();
}

// Tokenizes every document of a batch; stops at its first error.
void tokenizeBatch(Batch& b, InputFormat format, const PrepareOptions& opts, const Tokenizer& tokenizer) {
  std::string_view text = b.text;
  uint64_t lineNo = b.firstLine;
  std::string jsonText;
  for (size_t pos = 0; pos < text.size(); ++lineNo) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // A byte order mark (Windows editors write one) marks the file as UTF-8; it is not the first document's text.
    if (lineNo == 1 && line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);
    if (line.find_first_not_of(" \t\v\f") == std::string_view::npos) continue;  // a blank line: spaces and tabs alone
    auto where = [&] { return cat(opts.input, ":", lineNo, ": "); };
    if (size_t bad = unicode::findInvalidUtf8(line); bad != std::string_view::npos) {
      b.error = makeError(where(), "invalid UTF-8 at byte ", bad + 1, " of the line (input must be UTF-8 text)");
      return;
    }
    std::string_view doc = line;
    if (format == InputFormat::Jsonl) {
      nlohmann::json j;
      try {
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          // Tried only when the line fails as JSON proper, so that well-formed lines are scanned once.
          const std::string python = withNonFiniteAsZero(line);
          if (python.empty()) throw;
          j = nlohmann::json::parse(python);
        }
      } catch (const nlohmann::json::exception& e) {
        std::string reason = jsonReason(e.what());
        // '[' or '{' alone on a line: a pretty-printed file or one JSON array, not one object a line.
        if (reason.find("unexpected end of input") != std::string::npos)
          reason += " (JSONL holds one whole JSON object a line; write the corpus as JSON Lines, not as one "
                    "pretty-printed document or array)";
        b.error = makeError(where(), "not valid JSON: ", reason);
        return;
      }
      if (!j.is_object()) {
        b.error = makeError(where(), "expected a JSON object, got ", jsonTypeName(j));
        return;
      }
      auto it = j.find(opts.jsonKey);
      if (it == j.end()) {
        b.error = makeError(where(), "no \"", opts.jsonKey, "\" key (choose the key with --json-key)");
        return;
      }
      if (!it->is_string()) {
        b.error = makeError(where(), "\"", opts.jsonKey, "\" is a ", jsonTypeName(*it), ", not a string");
        return;
      }
      jsonText = it->get<std::string>();
      doc = jsonText;
    }
    if (doc.empty()) continue;
    size_t before = b.tokens.size();
    if (Status s = tokenizer.encode(doc, b.tokens); !s.ok()) {
      b.error = makeError(where(), s.error());
      return;
    }
    if (opts.appendEod) b.tokens.push_back(tokenizer.eod());
    size_t len = b.tokens.size() - before;
    if (len > static_cast<size_t>(INT32_MAX)) {
      b.error = makeError(where(), "a document of ", len, " tokens is too long for the format (int32 lengths)");
      return;
    }
    b.docLengths.push_back(static_cast<uint32_t>(len));
  }
}

// The tokenizing threads and their queue. Destruction stops and joins them.
class WorkerPool {
 public:
  WorkerPool(int n, InputFormat format, const PrepareOptions& opts, const Tokenizer& tokenizer) {
    for (int i = 0; i < n; ++i)
      threads_.emplace_back([this, format, &opts, &tokenizer] {
        while (Batch* b = take()) {
          tokenizeBatch(*b, format, opts, tokenizer);
          std::lock_guard<std::mutex> lk(mu_);
          b->done = true;
          doneCv_.notify_all();
        }
      });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      closing_ = true;
      todo_.clear();
    }
    workCv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(Batch* b) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      todo_.push_back(b);
    }
    workCv_.notify_one();
  }
  void waitDone(const Batch& b) {
    std::unique_lock<std::mutex> lk(mu_);
    doneCv_.wait(lk, [&] { return b.done; });
  }

 private:
  Batch* take() {
    std::unique_lock<std::mutex> lk(mu_);
    workCv_.wait(lk, [&] { return closing_ || !todo_.empty(); });
    if (todo_.empty()) return nullptr;
    Batch* b = todo_.front();
    todo_.pop_front();
    return b;
  }
  std::mutex mu_;
  std::condition_variable workCv_, doneCv_;
  std::deque<Batch*> todo_;
  bool closing_ = false;
  std::vector<std::thread> threads_;
};

Result<InputFormat> inputFormat(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return makeError(path, " is a directory; give one corpus file, FILE.txt (a document per line) or FILE.jsonl");
  auto ends = [&](std::string_view ext) { return path.size() > ext.size() && path.ends_with(ext); };
  if (ends(".jsonl") || ends(".json")) return InputFormat::Jsonl;
  if (ends(".txt")) return InputFormat::Text;
  return makeError("cannot tell the format of ", path, ": name it FILE.txt (a document per line) or FILE.jsonl");
}

}  // namespace

Result<PrepareStats> prepareDataset(const PrepareOptions& opts, const Tokenizer& tokenizer) {
  auto start = std::chrono::steady_clock::now();
  TPC_ASSIGN(InputFormat format, inputFormat(opts.input));
  if (opts.outputPrefix.empty()) return makeError("no output prefix given");
  if (opts.workers < 1) return makeError("workers must be at least 1");
  TPC_ASSIGN(LineBatchReader reader, LineBatchReader::open(opts.input));
  TPC_ASSIGN(DatasetWriter writer, DatasetWriter::create(opts.outputPrefix, tokenDTypeFor(tokenizer.vocabSize())));
  ProgressMeter progress("tpc prepare", reader.size(), opts.progress);

  PrepareStats stats;
  std::deque<std::unique_ptr<Batch>> inflight;  // declared before the pool: the pool joins first
  WorkerPool pool(opts.workers, format, opts, tokenizer);
  const size_t maxInflight = 4 * static_cast<size_t>(opts.workers);
  while (true) {
    while (inflight.size() < maxInflight && reader.more()) {
      auto batch = reader.next();
      if (!batch.ok()) {
        progress.finish();
        return Error{batch.error()};
      }
      inflight.push_back(std::move(batch).value());
      pool.submit(inflight.back().get());
    }
    if (inflight.empty()) break;
    Batch& b = *inflight.front();
    pool.waitDone(b);
    if (b.error) {
      progress.finish();
      return *b.error;
    }
    const int32_t* tokens = b.tokens.data();
    for (uint32_t len : b.docLengths) {
      if (Status s = writer.addDocument(std::span<const int32_t>(tokens, len)); !s.ok()) {
        progress.finish();
        return Error{s.error()};
      }
      tokens += len;
    }
    stats.inputBytes += b.text.size();
    progress.update(stats.inputBytes, writer.numTokens());
    inflight.pop_front();
  }
  progress.finish();
  if (writer.numDocuments() == 0)
    return makeError(opts.input, ": no documents (the input is empty or has only blank lines",
                     format == InputFormat::Jsonl ? " or empty texts)" : ")");
  stats.documents = writer.numDocuments();
  stats.tokens = writer.numTokens();
  TPC_TRY(writer.finish());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace tpc
