#include "runtime/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "ir/file_io.h"
#include "ir/json_text.h"
#include "llvm/Support/JSON.h"

namespace tpc {
namespace {

const char* stName(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

std::optional<DType> stParse(llvm::StringRef s) {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean})
    if (s == stName(d)) return d;
  return std::nullopt;
}

// The format caps the header at 100 MB; so do we, before reading it.
constexpr uint64_t kMaxHeader = 100'000'000;

}  // namespace

const HostTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

namespace {

// The 8-byte length and the JSON header, padded to 8 bytes; the tensors' bytes follow it in `file`'s order.
Result<std::string> safetensorsHeader(const SafetensorsFile& file) {
  llvm::json::Object header;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    if (name == "__metadata__" || !names.insert(name).second)
      return makeError("safetensors: tensor name '", name, "' is reserved or repeated");
    llvm::json::Array shape;
    for (int64_t d : t.shape()) shape.push_back(d);
    header[name] = llvm::json::Object{{"dtype", stName(t.dtype())},
                                      {"shape", std::move(shape)},
                                      {"data_offsets", llvm::json::Array{int64_t(offset), int64_t(offset + t.bytes())}}};
    offset += t.bytes();
  }
  if (!file.metadata.empty()) {
    llvm::json::Object meta;
    for (const auto& [k, v] : file.metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::string json;
  llvm::raw_string_ostream os(json);
  os << llvm::json::Value(std::move(header));
  os.flush();
  while (json.size() % 8) json += ' ';  // data starts 8-byte aligned, as the reference writer does
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

std::string_view bytesOf(const HostTensor& t) { return {reinterpret_cast<const char*>(t.raw()), t.bytes()}; }

}  // namespace

Result<std::string> serializeSafetensors(const SafetensorsFile& file) {
  TPC_ASSIGN(std::string out, safetensorsHeader(file));
  for (const auto& [name, t] : file.tensors) out += bytesOf(t);
  return out;
}

Status writeSafetensors(const std::string& path, const SafetensorsFile& file) {
  FileCommit commit;
  TPC_TRY(writeSafetensors(commit, path, file));
  return commit.commit();
}

Status writeSafetensors(FileCommit& commit, const std::string& path, const SafetensorsFile& file) {
  TPC_ASSIGN(std::string header, safetensorsHeader(file));
  std::vector<std::string_view> pieces{header};
  for (const auto& [name, t] : file.tensors) pieces.push_back(bytesOf(t));
  return commit.write(path, pieces);
}

namespace {

// Fills `n` bytes at `dst` from the data section (the bytes after the header), `offset` bytes into it.
using ReadData = std::function<Status(uint64_t offset, uint8_t* dst, uint64_t n)>;

// A file of `fileSize` bytes whose first 8 bytes said `headerLength`: the header's text is `headerText`; every
// tensor is checked against the header and the file's size before any tensor's bytes are read.
Result<SafetensorsFile> parseSafetensorsParts(const std::string& path, uint64_t fileSize, std::string_view headerText,
                                              const ReadData& read) {
  auto bad = [&](auto&&... what) { return makeError(path, ": error: not a valid safetensors file: ", what...); };
  auto parsed = parseJsonText(headerText);
  if (!parsed.ok()) return bad("header is ", parsed.error());
  const llvm::json::Object* header = parsed->getAsObject();
  if (!header) return bad("header is not a JSON object");
  const uint64_t dataSize = fileSize - 8 - headerText.size();
  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::pair<uint64_t, std::pair<std::string, HostTensor>>> ordered;
  for (const auto& [key, value] : *header) {
    std::string name = key.str();
    if (name == "__metadata__") {
      const llvm::json::Object* meta = value.getAsObject();
      if (!meta) return bad("__metadata__ is not an object");
      for (const auto& [mk, mv] : *meta) {
        auto s = mv.getAsString();
        if (!s) return bad("__metadata__ value of '", mk.str(), "' is not a string");
        file.metadata[mk.str()] = s->str();
      }
      continue;
    }
    const llvm::json::Object* entry = value.getAsObject();
    if (!entry) return bad("tensor '", name, "' is not an object");
    auto dtypeStr = entry->getString("dtype");
    const llvm::json::Array* shape = entry->getArray("shape");
    const llvm::json::Array* offs = entry->getArray("data_offsets");
    if (!dtypeStr || !shape || !offs || offs->size() != 2)
      return bad("tensor '", name, "' needs dtype, shape and data_offsets [begin, end]");
    auto dtype = stParse(*dtypeStr);
    if (!dtype) return bad("tensor '", name, "' has unsupported dtype ", dtypeStr->str());
    Shape dims;
    uint64_t numel = 1;
    for (const llvm::json::Value& d : *shape) {
      auto v = d.getAsInteger();
      if (!v || *v < 0 || (*v > 0 && numel > (uint64_t(1) << 50) / uint64_t(*v)))
        return bad("tensor '", name, "' has a bad shape entry");
      dims.push_back(*v);
      numel *= uint64_t(*v);
    }
    auto b = (*offs)[0].getAsInteger(), e = (*offs)[1].getAsInteger();
    if (!b || !e || *b < 0 || *e < *b || uint64_t(*e) > dataSize)
      return bad("tensor '", name, "' has data_offsets outside the file's ", dataSize, " data bytes");
    if (uint64_t(*e - *b) != numel * uint64_t(dtypeSize(*dtype)))
      return bad("tensor '", name, "': ", *e - *b, " bytes do not hold its shape and dtype (",
                 numel * uint64_t(dtypeSize(*dtype)), " bytes)");
    ranges.push_back({uint64_t(*b), uint64_t(*e)});
    // calloc'd storage: no memory is touched until its bytes are read below.
    ordered.push_back({uint64_t(*b), {name, HostTensor(TensorType(*dtype, dims))}});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return bad("two tensors' data overlap");
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [offset, nt] : ordered) {
    if (nt.second.bytes()) TPC_TRY(read(offset, nt.second.raw(), nt.second.bytes()));
    file.tensors.push_back(std::move(nt));
  }
  return file;
}

// The header length the first 8 bytes give, checked against the file's size.
Result<uint64_t> headerLength(const std::string& path, const char* first8, uint64_t fileSize) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<uint8_t>(first8[i])) << (8 * i);
  if (n > kMaxHeader || n > fileSize - 8)
    return makeError(path, ": error: not a valid safetensors file: header length ", n, " exceeds the file (", fileSize,
                     " bytes) or the 100 MB limit");
  return n;
}

}  // namespace

Result<SafetensorsFile> parseSafetensors(const std::string& path, std::string_view bytes) {
  if (bytes.size() < 8)
    return makeError(path, ": error: not a valid safetensors file: shorter than its 8-byte header length (", bytes.size(),
                     " bytes)");
  TPC_ASSIGN(uint64_t n, headerLength(path, bytes.data(), bytes.size()));
  const char* data = bytes.data() + 8 + n;
  return parseSafetensorsParts(path, bytes.size(), bytes.substr(8, n), [&](uint64_t offset, uint8_t* dst, uint64_t size) {
    std::memcpy(dst, data + offset, size);
    return Status{};
  });
}

Result<SafetensorsFile> readSafetensors(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return makeError(path, ": error: is a folder, not a safetensors file");
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return makeError(path, ": error: cannot open: ", std::strerror(errno));
  const uint64_t fileSize = static_cast<uint64_t>(std::max<std::streamoff>(f.tellg(), 0));
  f.seekg(0);
  // The header, then each tensor's bytes read straight into its own storage: one copy of the tensors in memory
  // (gpt2-xl's checkpoint is 18 GB; read whole first, it would be held twice).
  char first8[8];
  if (fileSize < 8 || !f.read(first8, 8))
    return makeError(path, ": error: not a valid safetensors file: shorter than its 8-byte header length (", fileSize,
                     " bytes)");
  TPC_ASSIGN(uint64_t n, headerLength(path, first8, fileSize));
  std::string header(n, '\0');
  if (!f.read(header.data(), static_cast<std::streamsize>(n)))
    return makeError(path, ": error: cannot read: ", std::strerror(errno));
  const uint64_t dataStart = 8 + n;
  return parseSafetensorsParts(path, fileSize, header, [&](uint64_t offset, uint8_t* dst, uint64_t size) -> Status {
    f.seekg(static_cast<std::streamoff>(dataStart + offset));
    if (!f.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(size)))
      return makeError(path, ": error: cannot read ", size, " bytes at ", dataStart + offset, " (the file changed while "
                       "it was read?): ", std::strerror(errno));
    return Status{};
  });
}

}  // namespace tpc
