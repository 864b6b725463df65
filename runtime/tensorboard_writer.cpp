// TensorBoard event files: TFRecord framing with CRC-32C, and tensorflow.Event protobufs encoded by hand (the few
// fields a scalar needs), so that tpc needs neither protobuf nor TensorFlow.
#include "runtime/tensorboard_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace tpc {

namespace {

std::array<uint32_t, 256> crcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // Castagnoli, reflected
    t[i] = c;
  }
  return t;
}

// Protobuf wire format: a varint, a key (field number and wire type), and the three field kinds an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wireType) { varint(out, static_cast<uint64_t>(field) << 3 | unsigned(wireType)); }
template <class T>
void littleEndian(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86 and ARM are little-endian
  out.append(b, sizeof(T));
}
void bytesField(std::string& out, int field, std::string_view bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out.append(bytes);
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5 (Summary).
std::string event(double wallTime, int64_t step) {
  std::string e;
  key(e, 1, 1);
  littleEndian(e, wallTime);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// The trainer's figure names and Megatron-LM's TensorBoard tags for them.
const std::map<std::string, std::string>& megatronTags() {
  static const std::map<std::string, std::string> tags = {
      {"loss", "lm loss"},
      {"lr", "learning-rate"},
      {"grad_norm", "grad-norm"},
      {"loss_scale", "loss-scale"},
      {"tokens_per_s", "tokens-per-second"},
      {"mfu", "mfu"},
      {"gpu_memory_bytes", "gpu-memory-bytes"},
      {"valid_loss", "lm loss validation"},
      {"valid_ppl", "lm loss validation ppl"},
      {"test_loss", "lm loss test"},
      {"test_ppl", "lm loss test ppl"},
  };
  return tags;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  static const std::array<uint32_t, 256> table = crcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t maskedCrc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

Result<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty()) return makeError("--tensorboard-dir is empty; name a folder (made if missing) for the event files");
  fs::path p = fs::absolute(dir, ec).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "runs/" is "runs"
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    return makeError("--tensorboard-dir ", dir, " is a file; name a folder (made if missing) for the event files");
  fs::path existing = p;  // the folder, or the nearest ancestor that exists: the one that must be writable
  while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    return makeError("--tensorboard-dir ", dir, ": ", existing.string(), " is a file, not a folder");
  if (::access(existing.c_str(), W_OK) != 0)
    return makeError("--tensorboard-dir ", dir, ": cannot write in ", existing.string(), " (", std::strerror(errno),
                     "); pick a folder you can write");
  // A folder that is missing is made at the first event, so that a run failing before it leaves none; whether it
  // can be made (a writable folder may still refuse it: /sys, /proc) is tried now, and the try undone.
  if (existing != p) {
    fs::path made = existing;
    for (const fs::path& part : p.lexically_relative(existing)) {
      made /= part;
      if (::mkdir(made.c_str(), 0755) != 0) {
        const int err = errno;
        for (fs::path q = made.parent_path(); q != existing; q = q.parent_path()) ::rmdir(q.c_str());
        return makeError("--tensorboard-dir ", dir, ": cannot make ", made.string(), " (", std::strerror(err),
                         "); pick a folder you can write");
      }
    }
    for (fs::path q = p; q != existing; q = q.parent_path()) ::rmdir(q.c_str());
  }
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter);
  w->dir_ = p.string();
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

Status TensorBoardWriter::writeEvent(const std::string& e) {
  std::string record;
  littleEndian(record, static_cast<uint64_t>(e.size()));
  littleEndian(record, maskedCrc32c(record));
  record += e;
  littleEndian(record, maskedCrc32c(e));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    return makeError("--tensorboard-dir: writing ", path_, " failed (", std::strerror(errno), "; is the disk full?)");
  return {};
}

Status TensorBoardWriter::scalars(int64_t step, const std::map<std::string, double>& values) {
  if (!file_) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    // PyTorch's SummaryWriter names its files the same way; TensorBoard reads any name holding "tfevents".
    path_ = dir_ + "/events.out.tfevents." + std::to_string(static_cast<long long>(now())) + "." + host + "." +
            std::to_string(::getpid()) + ".tpc";
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) return makeError("--tensorboard-dir: cannot write ", path_, " (", std::strerror(errno), ")");
    std::string first = event(now(), 0);
    bytesField(first, 3, "brain.Event:2");
    TPC_TRY(writeEvent(first));
  }
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytesField(value, 1, tag);
    key(value, 2, 5);  // simple_value: float
    littleEndian(value, static_cast<float>(v));
    bytesField(summary, 1, value);
  }
  std::string e = event(now(), step);
  bytesField(e, 5, summary);
  return writeEvent(e);
}

Status TensorBoardWriter::publish(const std::map<std::string, double>& figures) {
  if (failed_) return {};
  if (auto s = figures.find("step"); s != figures.end()) lastStep_ = static_cast<int64_t>(s->second);
  std::map<std::string, double> values;
  for (const auto& [name, v] : figures)
    if (auto t = megatronTags().find(name); t != megatronTags().end()) values[t->second] = v;
  if (values.empty()) return {};
  Status s = scalars(lastStep_, values);
  failed_ = !s.ok();
  return s;
}

}  // namespace tpc
