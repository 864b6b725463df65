// Model files: flatbuffers (model.fbs) <-> ModelFile. Loading trusts nothing: the buffer is verified,
// every index, enum and size is checked, and the graph is rebuilt through Graph::create.
#include "frontend/model_file.h"

#include "ir/file_io.h"

#include <flatbuffers/flatbuffers.h>
#include <flatbuffers/idl.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "frontend/model_generated.h"
#include "frontend/model_schema.inc"
#include "frontend/unicode_classes.h"
#include "ir/assert.h"
#include "tpc/version.h"

namespace tpc {
namespace {

constexpr size_t kMaxFileBytes = size_t(1) << 30;
constexpr size_t kMaxRank = 16;
constexpr int64_t kMaxDim = int64_t(1) << 40;
constexpr int64_t kMaxNumel = int64_t(1) << 50;
constexpr size_t kMaxIntsAttr = 64;
// The schema's name for the IR's `bool` (a keyword in flatbuffers' language).
constexpr std::string_view fbBoolName = "boolean";

bool endsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Text from a file, made safe to show on one line: at most 64 printable characters.
std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 64) out += "...";
  return out;
}

// Names that the text form can print and parse back: letters, digits, '_' and '.'.
bool validName(std::string_view s) {
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return s.size() <= 256;
}

// numel with overflow checks; false when a dim or the product leaves the supported range.
bool boundedShape(llvm::ArrayRef<int64_t> shape) {
  if (shape.size() > kMaxRank) return false;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxDim) return false;
    if (d != 0 && n > kMaxNumel / d) return false;
    n *= d;
  }
  return true;
}

// Value::hasName's rule: empty or all digits means an unnamed value that the printer numbers.
bool isNamed(const std::string& s) {
  return !s.empty() && !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string str(const flatbuffers::String* s, const char* def = "") { return s ? s->str() : std::string(def); }

// flatbuffers 2.0's verifier checks only the 4-byte length of a vector, not the alignment of its
// elements (flatbuffers 23 does): a crafted file can put a [long] or [double] at an address that is not
// 8-aligned, and reading it is undefined behaviour. The buffer itself is 8-aligned (a fresh vector).
// An empty vector is never read, and flatbuffers' own builder leaves it 4-aligned.
template <class T>
bool alignedVector(const flatbuffers::Vector<T>* v) {
  return v->size() == 0 || reinterpret_cast<uintptr_t>(v->data()) % alignof(T) == 0;
}

// ---- flatbuffers -> ModelFile ------------------------------------------------------------------

TrainConfig configFromFb(const fb::TrainConfig* c) {
  TrainConfig t;
  if (!c) return t;
  t.optimizer = str(c->optimizer(), "adamw");
  t.beta1 = c->adam_beta1();
  t.beta2 = c->adam_beta2();
  t.eps = c->adam_eps();
  t.weightDecay = c->weight_decay();
  t.clipGrad = c->clip_grad();
  t.lr = c->lr();
  t.minLr = c->min_lr();
  t.warmupIters = c->lr_warmup_iters();
  t.decayStyle = str(c->lr_decay_style(), "cosine");
  t.decayIters = c->lr_decay_iters();
  t.microBatch = c->micro_batch_size();
  t.globalBatch = c->global_batch_size();
  t.seqLength = c->seq_length();
  t.trainIters = c->train_iters();
  t.dataPath = str(c->data_path());
  t.split = str(c->split(), "949,50,1");
  t.tokenizer = str(c->tokenizer_type(), "gpt2");
  t.tp = c->tensor_model_parallel_size();
  t.dp = c->data_parallel_size();
  t.sp = c->sequence_parallel();
  t.distributedOptimizer = c->use_distributed_optimizer();
  t.logInterval = c->log_interval();
  t.evalInterval = c->eval_interval();
  t.evalIters = c->eval_iters();
  t.saveInterval = c->save_interval();
  t.seed = c->seed();
  t.precision = str(c->precision(), "auto");
  t.recompute = str(c->recompute(), "none");
  return t;
}

GptConfig gptFromFb(const fb::GptArch* a) {
  GptConfig g;
  g.layers = a->layers();
  g.hidden = a->hidden();
  g.heads = a->heads();
  g.vocab = a->vocab();
  g.paddedVocab = a->padded_vocab();
  g.positions = a->positions();
  g.hiddenDropout = a->hidden_dropout();
  g.attentionDropout = a->attention_dropout();
  g.layerNormEps = a->layer_norm_eps();
  g.initStd = a->init_std();
  return g;
}

// Reads the architecture union; `archType` is the raw union tag.
Result<std::optional<GptConfig>> archFromFb(fb::Architecture archType, const void* arch) {
  switch (archType) {
    case fb::Architecture::NONE: return std::optional<GptConfig>();
    case fb::Architecture::GptArch:
      // The verifier passes a union whose type is set and whose table is absent (found by fuzz_model_fb).
      if (!arch) return makeError("arch_type is GptArch but arch is missing (a corrupt file: write both or neither)");
      return std::optional<GptConfig>(gptFromFb(static_cast<const fb::GptArch*>(arch)));
  }
  return makeError("arch_type ", static_cast<int>(archType), " is not a known architecture (known: GptArch)");
}

Result<DType> dtypeFromFb(fb::DType d) {
  if (static_cast<uint8_t>(d) > static_cast<uint8_t>(fb::DType::MAX))
    return makeError("dtype ", static_cast<int>(d), " is not a dtype");
  const std::string_view name = fb::EnumNameDType(d);
  if (name == fbBoolName) return DType::boolean;
  auto parsed = parseDType(name);
  TPC_ASSERT(parsed.has_value(), "dtype of model.fbs missing from the IR: " + std::string(name));
  return *parsed;
}

Result<Attr> attrFromFb(const fb::Attribute* a) {
  switch (a->value_type()) {
    case fb::AttrValue::IntAttr: return Attr(static_cast<int64_t>(a->value_as_IntAttr()->v()));
    case fb::AttrValue::FloatAttr: {
      double v = a->value_as_FloatAttr()->v();
      if (!std::isfinite(v)) return makeError("must be finite, got ", formatFloat(v));
      return Attr(v);
    }
    case fb::AttrValue::BoolAttr: return Attr(a->value_as_BoolAttr()->v());
    case fb::AttrValue::StringAttr: return Attr(a->value_as_StringAttr()->v()->str());
    case fb::AttrValue::IntsAttr: {
      std::vector<int64_t> v;
      if (const auto* xs = a->value_as_IntsAttr()->v()) {
        if (xs->size() > kMaxIntsAttr) return makeError("has ", xs->size(), " values (at most ", kMaxIntsAttr, ")");
        if (!alignedVector(xs)) return makeError("is misaligned in the file (a corrupt file)");
        // Bounded so that shape attributes multiply without overflow in any shape rule.
        int64_t product = 1;
        for (int64_t x : *xs) {
          if (x < -kMaxDim || x > kMaxDim) return makeError("value ", x, " is out of range");
          int64_t m = std::max<int64_t>(std::abs(x), 1);
          if (product > kMaxNumel / m) return makeError("values multiply to more than 2^50");
          product *= m;
          v.push_back(x);
        }
      }
      return Attr(std::move(v));
    }
    case fb::AttrValue::DTypeAttr: {
      TPC_ASSIGN(DType d, dtypeFromFb(a->value_as_DTypeAttr()->v()));
      return Attr(d);
    }
    case fb::AttrValue::NONE: break;
  }
  return makeError("value_type ", static_cast<int>(a->value_type()), " is not an attribute kind");
}

// Builds the graph; errors come back without the file prefix (the caller adds it).
Result<std::unique_ptr<Graph>> graphFromFb(const fb::Graph* fg) {
  std::string gname = str(fg->name());
  if (gname.empty()) gname = "main";
  if (!validName(gname)) return makeError("graph.name '", shown(gname), "' may only contain letters, digits, '_' and '.'");
  auto g = std::make_unique<Graph>(gname);

  const auto* tensors = fg->tensors();
  const size_t nt = tensors ? tensors->size() : 0;
  std::vector<Value*> values(nt, nullptr);
  std::vector<TensorType> types(nt);
  std::vector<fb::TensorKind> kinds(nt);
  std::set<std::string> names;
  auto tensorWhere = [&](size_t i) {
    std::string n = str(tensors->Get(i)->name());
    return cat("graph.tensors[", i, "]", n.empty() ? "" : " '" + shown(n) + "'");
  };
  for (size_t i = 0; i < nt; ++i) {
    const fb::Tensor* t = tensors->Get(i);
    std::string where = tensorWhere(i);
    std::string name = str(t->name());
    if (!validName(name)) return makeError(where, ": name may only contain letters, digits, '_' and '.'");
    auto dt = dtypeFromFb(t->dtype());
    if (!dt) return makeError(where, ".", dt.error());
    if (static_cast<uint8_t>(t->kind()) > static_cast<uint8_t>(fb::TensorKind::MAX))
      return makeError(where, ".kind ", static_cast<int>(t->kind()), " is not a tensor kind (value, input, param)");
    Shape shape;
    if (const auto* s = t->shape()) {
      if (s->size() > kMaxRank) return makeError(where, ".shape has rank ", s->size(), " (at most ", kMaxRank, ")");
      if (!alignedVector(s)) return makeError(where, ".shape is misaligned in the file (a corrupt file)");
      shape.assign(s->begin(), s->end());
    }
    if (!boundedShape(shape)) return makeError(where, ".shape ", shapeStr(shape), " has a negative or too large size");
    types[i] = TensorType(*dt, shape);
    kinds[i] = t->kind();
    if (isNamed(name)) {
      if (!names.insert(name).second) return makeError(where, ": the name is used by another tensor");
    } else if (t->kind() != fb::TensorKind::value) {
      return makeError(where, ": inputs and params need a name");
    }
    if (t->init() && t->kind() != fb::TensorKind::param) return makeError(where, ".init is only allowed on params");
    if (t->kind() == fb::TensorKind::input) {
      values[i] = g->addInput(name, types[i]);
    } else if (t->kind() == fb::TensorKind::param) {
      InitSpec init;
      if (const fb::Init* in = t->init()) {
        init.kind = in->kind()->str();
        if (const auto* args = in->args()) {
          if (!alignedVector(args)) return makeError(where, ".init.args is misaligned in the file (a corrupt file)");
          init.args.assign(args->begin(), args->end());
        }
        for (double a : init.args)
          if (!std::isfinite(a)) return makeError(where, ".init: arguments must be finite, got ", formatFloat(a));
        if (Status s = validateInit(init); !s.ok()) return makeError(where, ".init: ", shown(s.error()));
      }
      values[i] = g->addParam(name, types[i], std::move(init));
    }
  }

  const auto* nodes = fg->nodes();
  const size_t nn = nodes ? nodes->size() : 0;
  for (size_t j = 0; j < nn; ++j) {
    const fb::Node* fn = nodes->Get(j);
    std::string opname = fn->op()->str();
    std::string where = cat("graph.nodes[", j, "] (", shown(opname), ")");
    auto op = lookupOp(opname);
    if (!op) return makeError("graph.nodes[", j, "]: unknown op '", shown(opname), "'");
    llvm::SmallVector<Value*, 4> operands;
    if (const auto* ops = fn->operands())
      for (size_t k = 0; k < ops->size(); ++k) {
        uint32_t idx = ops->Get(k);
        if (idx >= nt) return makeError(where, ".operands[", k, "]=", idx, " is not a tensor index (the graph has ", nt, ")");
        if (!values[idx])
          return makeError(where, ".operands[", k, "]: ", tensorWhere(idx),
                           " is used before a node defines it (nodes must be in program order)");
        operands.push_back(values[idx]);
      }
    AttrDict attrs;
    if (const auto* as = fn->attrs())
      for (size_t k = 0; k < as->size(); ++k) {
        const fb::Attribute* a = as->Get(k);
        std::string an = a->name()->str();
        if (attrs.find(an)) return makeError(where, ".attrs: '", shown(an), "' is given twice");
        auto v = attrFromFb(a);
        if (!v) return makeError(where, ".attrs '", shown(an), "': ", v.error());
        attrs.set(an, std::move(*v));
      }
    auto created = g->create(*op, operands, std::move(attrs));
    if (!created) return makeError(where, ": ", created.error());
    Node* n = *created;
    const auto* rs = fn->results();
    size_t nr = rs ? rs->size() : 0;
    if (nr != n->numResults()) return makeError(where, ".results: ", opname, " has ", n->numResults(), " result(s), the file lists ", nr);
    for (size_t k = 0; k < nr; ++k) {
      uint32_t idx = rs->Get(k);
      if (idx >= nt) return makeError(where, ".results[", k, "]=", idx, " is not a tensor index (the graph has ", nt, ")");
      if (kinds[idx] != fb::TensorKind::value)
        return makeError(where, ".results[", k, "]: ", tensorWhere(idx), " is an input or param, not a value");
      if (values[idx]) return makeError(where, ".results[", k, "]: ", tensorWhere(idx), " is already defined");
      Value* r = n->result(k);
      if (r->type() != types[idx])
        return makeError(where, ": result ", k, " (", tensorWhere(idx), ") is declared ", types[idx].str(), " but ", opname,
                         " gives ", r->type().str());
      r->setName(str(tensors->Get(idx)->name()));
      values[idx] = r;
    }
  }
  for (size_t i = 0; i < nt; ++i)
    if (!values[i]) return makeError(tensorWhere(i), " is a value that no node defines");

  const auto* outs = fg->outputs();
  if (!outs || outs->size() == 0) return makeError("graph.outputs is empty: a model has at least its loss as an output");
  std::set<std::string> outNames;
  for (size_t k = 0; k < outs->size(); ++k) {
    const fb::Output* o = outs->Get(k);
    if (o->tensor() >= nt)
      return makeError("graph.outputs[", k, "].tensor=", o->tensor(), " is not a tensor index (the graph has ", nt, ")");
    std::string name = str(o->name());
    if (!validName(name)) return makeError("graph.outputs[", k, "].name may only contain letters, digits, '_' and '.'");
    g->addOutput(values[o->tensor()], name);
    if (!outNames.insert(g->outputName(k)).second)
      return makeError("graph.outputs[", k, "]: the output name '", g->outputName(k), "' is used twice");
  }
  return g;
}

// The buffer must already have passed the identifier check and the verifier.
Result<ModelFile> modelFromFb(const fb::Model* m) {
  if (m->format_version() != kModelFormatVersion)
    return makeError("format_version ", m->format_version(), " is not supported (this tpc reads version ", kModelFormatVersion, ")");
  ModelFile out;
  TPC_ASSIGN(out.forward, graphFromFb(m->graph()));
  out.lossOutput = str(m->loss());
  if (out.lossOutput.empty()) return makeError("loss is missing: it names the output that is the loss");
  const Graph& g = *out.forward;
  const Value* loss = nullptr;
  for (size_t i = 0; i < g.outputs().size(); ++i)
    if (g.outputName(i) == out.lossOutput) loss = g.outputs()[i].value;
  if (!loss) return makeError("loss '", shown(out.lossOutput), "' is not one of graph.outputs");
  if (loss->shape().size() != 0 || !isFloat(loss->dtype()))
    return makeError("loss '", out.lossOutput, "' must be a float scalar, got ", loss->type().str());
  // Without the table every field would take its default (seq_length 1024, ...), which the graph's inputs do not
  // have; an empty table asks for the defaults.
  if (!m->config())
    return makeError("config is missing: a model file holds its training configuration (tpc new writes one; "
                     "\"config\": {} takes every field's default)");
  out.config = configFromFb(m->config());
  TPC_TRY(validateTrainConfig(out.config));
  TPC_ASSIGN(out.gpt, archFromFb(m->arch_type(), m->arch()));
  if (out.gpt) TPC_TRY(validateGpt(*out.gpt, out.config));
  return out;
}

// ---- JSON: parsed by flatbuffers' own parser against the embedded schema -------------------------

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The offset of 1-based (line, col) in `text`, clamped to its size.
size_t offsetOf(const std::string& text, long line, long col) {
  size_t at = 0;
  for (long l = 1; l < line; ++l) {
    at = text.find('\n', at);
    if (at == std::string::npos) return text.size();
    ++at;
  }
  return std::min(text.size(), at + static_cast<size_t>(std::max(0L, col)));
}

// The JSON key of the `"key":` at or before offset `at`, and where its quote opens ("" and npos if none).
std::pair<std::string, size_t> keyBefore(const std::string& text, size_t at) {
  for (size_t colon = text.rfind(':', at); colon != std::string::npos && colon > 0; colon = text.rfind(':', colon - 1)) {
    size_t q = text.find_last_not_of(" \t\r\n", colon - 1);
    if (q == std::string::npos || q == 0 || text[q] != '"') continue;
    size_t open = text.rfind('"', q - 1);
    if (open == std::string::npos) break;
    return {text.substr(open + 1, q - open - 1), open};
  }
  return {"", std::string::npos};
}

// The key that holds the object around offset `at` ("config" for a field of "config": {...}; "tensors" inside
// "tensors": [{...}]); "" at the top level. Brackets inside strings are skipped.
std::string enclosingKey(const std::string& text, size_t at) {
  int depth = 0;
  bool inString = false;
  for (size_t i = std::min(at, text.size()); i-- > 0;) {
    char c = text[i];
    if (c == '"') {
      size_t slashes = 0;
      while (i > slashes && text[i - 1 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) inString = !inString;
      continue;
    }
    if (inString) continue;
    if (c == '}' || c == ']') ++depth;
    if ((c == '{' || c == '[') && depth-- == 0) {
      size_t before = i == 0 ? std::string::npos : text.find_last_not_of(" \t\r\n", i - 1);
      if (before == std::string::npos) return "";
      if (text[before] == ':') return keyBefore(text, before).first;
      depth = 0;  // an element of an array: go on to the array's own '['
    }
  }
  return "";
}

// The tables a JSON object may be: the root (`table` empty), or the type of the field named `table` (each member
// of a union's).
std::vector<const flatbuffers::StructDef*> tablesOf(const std::string& table, const flatbuffers::Parser& schema) {
  if (table.empty()) return {schema.root_struct_def_};
  std::vector<const flatbuffers::StructDef*> in;
  for (const flatbuffers::StructDef* sd : schema.structs_.vec)
    for (const flatbuffers::FieldDef* f : sd->fields.vec) {
      if (f->name != table || !in.empty()) continue;
      if (f->value.type.struct_def) in.push_back(f->value.type.struct_def);
      if (const flatbuffers::EnumDef* e = f->value.type.enum_def; e && e->is_union)
        for (const flatbuffers::EnumVal* v : e->Vals())
          if (v->union_type.struct_def) in.push_back(v->union_type.struct_def);
    }
  return in;
}

// What flatbuffers' message leaves out, from the schema's tables for the enclosing object (`table`: the key
// holding it, "" for the root): the values of the enum the field `key` takes, or the field closest to an unknown one.
std::string schemaHint(const std::string& what, const std::string& key, const std::string& table,
                       const flatbuffers::Parser& schema) {
  const std::string badEnum = "unknown enum value: ", badField = "unknown field: ";
  const std::vector<const flatbuffers::StructDef*> in = tablesOf(table, schema);
  if (what.rfind(badEnum, 0) == 0 && !key.empty()) {
    for (const flatbuffers::StructDef* sd : in)
      for (const flatbuffers::FieldDef* f : sd->fields.vec) {
        const flatbuffers::EnumDef* e = f->value.type.enum_def;
        if (f->name != key || !e || e->is_union) continue;
        std::string values;
        for (const flatbuffers::EnumVal* v : e->Vals()) values += (values.empty() ? "" : ", ") + v->name;
        return " (" + key + " is one of: " + values + ")";
      }
  }
  if (what.rfind(badField, 0) == 0) {
    const std::string name = what.substr(badField.size());
    std::string best;
    size_t bestDistance = std::max<size_t>(1, name.size() / 3) + 1;
    for (const flatbuffers::StructDef* sd : in)
      for (const flatbuffers::FieldDef* f : sd->fields.vec)
        if (size_t d = editDistance(name, f->name); d < bestDistance) bestDistance = d, best = f->name;
    if (!best.empty()) return " (did you mean \"" + best + "\"?)";
  }
  return "";
}

// The keys of the JSON object that ends at or just before offset `at` (its own keys, not its members' keys), with
// the offset of its '{' (npos if none). Brackets inside strings are skipped.
std::pair<std::vector<std::string>, size_t> objectKeysBefore(const std::string& text, size_t at) {
  size_t close = std::min(at, text.size() - 1);
  if (text.empty() || text[close] != '}') close = text.find_last_not_of(" \t\r\n", close == 0 ? 0 : close - 1);
  if (close == std::string::npos || text[close] != '}') return {{}, std::string::npos};
  std::vector<std::pair<size_t, size_t>> strings;  // [open quote, close quote] at depth 1, in reverse order
  int depth = 0;
  bool inString = false;
  size_t stringEnd = 0;
  for (size_t i = close + 1; i-- > 0;) {
    char c = text[i];
    if (c == '"') {
      size_t slashes = 0;
      while (i > slashes && text[i - 1 - slashes] == '\\') ++slashes;
      if (slashes % 2 != 0) continue;
      inString = !inString;
      if (inString) stringEnd = i;
      else if (depth == 1) strings.push_back({i, stringEnd});
      continue;
    }
    if (inString) continue;
    if (c == '}' || c == ']') ++depth;
    if ((c == '{' || c == '[') && --depth == 0) {
      std::vector<std::string> keys;
      for (auto [open, end] : strings) {  // a string followed by ':' is a key
        size_t next = text.find_first_not_of(" \t\r\n", end + 1);
        if (next != std::string::npos && text[next] == ':') keys.push_back(text.substr(open + 1, end - open - 1));
      }
      return {keys, i};
    }
  }
  return {{}, std::string::npos};
}

// flatbuffers' "expecting: , instead got: }" at the end of an object that holds a union without its type field
// (arch without arch_type, an attribute's value without value_type): which field, and the types it may name.
std::string missingUnionType(const std::string& text, size_t at, const flatbuffers::Parser& schema) {
  auto [keys, open] = objectKeysBefore(text, at);
  if (open == std::string::npos) return "";
  for (const flatbuffers::StructDef* sd : tablesOf(enclosingKey(text, open + 1), schema))
    for (const flatbuffers::FieldDef* f : sd->fields.vec) {
      const flatbuffers::EnumDef* e = f->value.type.enum_def;
      if (!e || !e->is_union || f->value.type.base_type != flatbuffers::BASE_TYPE_UNION) continue;
      const std::string typeField = f->name + "_type";  // flatbuffers' name for a union's type field
      if (std::find(keys.begin(), keys.end(), f->name) == keys.end() ||
          std::find(keys.begin(), keys.end(), typeField) != keys.end())
        continue;
      std::string values;
      for (const flatbuffers::EnumVal* v : e->Vals())
        if (v->union_type.struct_def) values += (values.empty() ? "" : ", ") + v->name;
      return "\"" + f->name + "\" needs \"" + typeField + "\" beside it, naming its type (one of: " + values + ")";
    }
  return "";
}

// flatbuffers reports "LINE: COL: error: what" (possibly after warnings); we say "FILE:LINE:COL: error: what",
// with a hint from the schema where it has one.
std::string parserError(const flatbuffers::Parser& parser, const std::string& text, const std::string& file) {
  const std::string& raw = parser.error_;
  std::string last = raw;
  size_t e = raw.rfind("error: ");
  if (e != std::string::npos) {
    size_t lineStart = raw.rfind('\n', e);
    last = raw.substr(lineStart == std::string::npos ? 0 : lineStart + 1);
  }
  if (size_t nl = last.find('\n'); nl != std::string::npos) last.resize(nl);
  size_t err = last.find("error: ");
  std::string where = err == std::string::npos ? "" : last.substr(0, err);
  std::string what = err == std::string::npos ? last : last.substr(err + 7);
  std::string pos;
  for (char c : where)
    if (c != ' ') pos += c;
  if (!pos.empty() && pos.back() == ':') pos.pop_back();
  long line = 0, col = 0;
  std::sscanf(pos.c_str(), "%ld:%ld", &line, &col);
  // The parser still holds the schema after a failed parse of the JSON.
  const size_t at = offsetOf(text, line, col);
  auto [key, keyAt] = keyBefore(text, at);
  const std::string table = enclosingKey(text, keyAt == std::string::npos ? at : keyAt);
  if (what.rfind("expecting: , instead got: }", 0) == 0)
    if (std::string union_ = missingUnionType(text, at, parser); !union_.empty()) what = union_;
  return file + (pos.empty() ? "" : ":" + pos) + ": error: " + what + schemaHint(what, key, table, parser);
}

std::unique_ptr<flatbuffers::Parser> schemaParser() {
  flatbuffers::IDLOptions opts;
  opts.skip_unexpected_fields_in_json = false;  // unknown fields are errors
  auto parser = std::make_unique<flatbuffers::Parser>(opts);
  std::string schema(kModelSchema);
  TPC_ASSERT(parser->Parse(schema.c_str()), "the embedded model.fbs does not parse: " + parser->error_);
  return parser;
}

Result<std::vector<uint8_t>> jsonToBuffer(std::string_view json, const std::string& file, const char* rootType) {
  if (json.find('\0') != std::string_view::npos) return makeError(file, ": error: not a JSON model file (it contains NUL bytes)");
  auto parser = schemaParser();
  if (rootType) TPC_ASSERT(parser->SetRootType(rootType), rootType);
  std::string text(json);
  if (!parser->Parse(text.c_str())) return Error{parserError(*parser, text, file)};
  const uint8_t* p = parser->builder_.GetBufferPointer();
  return std::vector<uint8_t>(p, p + parser->builder_.GetSize());
}

// Writes any table of the schema as JSON, driven by the parsed schema (so new fields need no code
// here). flatbuffers' own text generator prints doubles with 12 digits; we print them exactly.
class JsonWriter {
 public:
  std::string table(const flatbuffers::Table* t, const flatbuffers::StructDef& sd, int indent) {
    // A table that fits on one line is printed on one line.
    std::string flat = render(t, sd, indent, true);
    if (flat.size() + indent <= 160 || flat.find('{', 1) == std::string::npos) return flat;
    return render(t, sd, indent, false);
  }

  // The first string field that is not UTF-8, which JSON cannot hold ("" when none): "FIELD (byte N of 'TEXT')".
  const std::string& notUtf8() const { return notUtf8_; }

 private:
  std::string notUtf8_;

  std::string quote(std::string_view s, std::string_view field = {}) {
    if (size_t at = unicode::findInvalidUtf8(s); at != std::string_view::npos && notUtf8_.empty())
      notUtf8_ = cat(field, " (byte ", at, " of '", shown(s), "')");
    std::string o = "\"";
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') {
        o += '\\';
        o += static_cast<char>(c);
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        o += buf;
      } else {
        o += static_cast<char>(c);
      }
    }
    return o + "\"";
  }

  template <class T>
  static T constant(const flatbuffers::FieldDef& f) {
    const std::string& c = f.value.constant;
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(std::strtod(c.c_str(), nullptr));
    else if constexpr (std::is_signed_v<T>) return static_cast<T>(std::strtoll(c.c_str(), nullptr, 10));
    else return static_cast<T>(std::strtoull(c.c_str(), nullptr, 10));
  }

  // The text of a scalar at `p` (a vector element) or of a table field (present or default).
  std::string scalar(flatbuffers::BaseType bt, const flatbuffers::EnumDef* ed, const uint8_t* p,
                     const flatbuffers::Table* t, const flatbuffers::FieldDef* f) {
    auto read = [&](auto zero) {
      using T = decltype(zero);
      if (p) return flatbuffers::ReadScalar<T>(p);
      return t->GetField<T>(f->value.offset, constant<T>(*f));
    };
    auto integer = [&](int64_t v) -> std::string {
      if (ed)
        if (const flatbuffers::EnumVal* ev = ed->ReverseLookup(v, false)) return quote(ev->name);
      return std::to_string(v);
    };
    using namespace flatbuffers;
    switch (bt) {
      case BASE_TYPE_BOOL: return read(uint8_t()) ? "true" : "false";
      case BASE_TYPE_CHAR: return integer(read(int8_t()));
      case BASE_TYPE_UTYPE:
      case BASE_TYPE_UCHAR: return integer(read(uint8_t()));
      case BASE_TYPE_SHORT: return integer(read(int16_t()));
      case BASE_TYPE_USHORT: return integer(read(uint16_t()));
      case BASE_TYPE_INT: return integer(read(int32_t()));
      case BASE_TYPE_UINT: return integer(read(uint32_t()));
      case BASE_TYPE_LONG: return integer(read(int64_t()));
      case BASE_TYPE_ULONG: return std::to_string(read(uint64_t()));
      case BASE_TYPE_FLOAT: return formatFloat(read(float()));
      case BASE_TYPE_DOUBLE: return formatFloat(read(double()));
      default: TPC_ASSERT(false, "not a scalar type");
    }
  }

  std::string render(const flatbuffers::Table* t, const flatbuffers::StructDef& sd, int indent, bool flat) {
    using namespace flatbuffers;
    std::vector<std::pair<std::string, std::string>> items;
    for (const FieldDef* f : sd.fields.vec) {
      if (f->deprecated) continue;
      const Type& ty = f->value.type;
      voffset_t off = f->value.offset;
      if (ty.base_type == BASE_TYPE_UTYPE) {
        uint8_t tag = t->GetField<uint8_t>(off, 0);
        if (tag != 0) items.emplace_back(f->name, scalar(ty.base_type, ty.enum_def, nullptr, t, f));
      } else if (IsScalar(ty.base_type)) {
        items.emplace_back(f->name, scalar(ty.base_type, ty.enum_def, nullptr, t, f));
      } else if (!t->CheckField(off)) {
        continue;
      } else if (ty.base_type == BASE_TYPE_STRING) {
        items.emplace_back(f->name, quote(t->GetPointer<const String*>(off)->string_view(), f->name));
      } else if (ty.base_type == BASE_TYPE_STRUCT) {
        TPC_ASSERT(!ty.struct_def->fixed, "structs are not used by model.fbs");
        items.emplace_back(f->name, sub(t->GetPointer<const Table*>(off), *ty.struct_def, indent, flat));
      } else if (ty.base_type == BASE_TYPE_UNION) {
        const FieldDef* tagField = sd.fields.Lookup(f->name + UnionTypeFieldSuffix());
        TPC_ASSERT(tagField, f->name);
        uint8_t tag = t->GetField<uint8_t>(tagField->value.offset, 0);
        const EnumVal* ev = ty.enum_def->ReverseLookup(tag, true);
        if (ev && ev->union_type.struct_def)
          items.emplace_back(f->name, sub(t->GetPointer<const Table*>(off), *ev->union_type.struct_def, indent, flat));
      } else if (ty.base_type == BASE_TYPE_VECTOR) {
        items.emplace_back(f->name, vector(t, *f, indent, flat));
      } else {
        TPC_ASSERT(false, "model.fbs uses a field type the JSON writer does not know: " + f->name);
      }
    }
    std::string pad(flat ? 0 : indent + 2, ' ');
    std::string o = "{";
    for (size_t i = 0; i < items.size(); ++i) {
      o += i ? "," : "";
      o += flat ? (i ? " " : "") : "\n" + pad;
      o += quote(items[i].first) + ": " + items[i].second;
    }
    if (!flat && !items.empty()) o += "\n" + std::string(indent, ' ');
    return o + "}";
  }

  std::string sub(const flatbuffers::Table* t, const flatbuffers::StructDef& sd, int indent, bool flat) {
    return flat ? render(t, sd, indent, true) : table(t, sd, indent + 2);
  }

  std::string vector(const flatbuffers::Table* t, const flatbuffers::FieldDef& f, int indent, bool flat) {
    using namespace flatbuffers;
    const Type elem = f.value.type.VectorType();
    const auto* raw = t->GetPointer<const Vector<uint8_t>*>(f.value.offset);
    uoffset_t n = raw->size();
    std::string o = "[";
    if (IsScalar(elem.base_type)) {
      size_t size = SizeOf(elem.base_type);
      for (uoffset_t i = 0; i < n; ++i)
        o += (i ? ", " : "") + scalar(elem.base_type, elem.enum_def, raw->Data() + i * size, nullptr, nullptr);
      return o + "]";
    }
    if (elem.base_type == BASE_TYPE_STRING) {
      const auto* v = reinterpret_cast<const Vector<Offset<String>>*>(raw);
      for (uoffset_t i = 0; i < n; ++i) o += (i ? ", " : "") + quote(v->Get(i)->string_view(), f.name);
      return o + "]";
    }
    TPC_ASSERT(elem.base_type == BASE_TYPE_STRUCT && !elem.struct_def->fixed, "unsupported vector in model.fbs: " + f.name);
    const auto* v = reinterpret_cast<const Vector<Offset<Table>>*>(raw);
    std::string pad(indent + 4, ' ');
    for (uoffset_t i = 0; i < n; ++i) {
      if (flat) o += (i ? ", " : "") + render(v->Get(i), *elem.struct_def, 0, true);
      else o += (i ? ",\n" : "\n") + pad + table(v->Get(i), *elem.struct_def, indent + 4);
    }
    if (!flat && n) o += "\n" + std::string(indent + 2, ' ');
    return o + "]";
  }
};

// ---- ModelFile -> flatbuffers ------------------------------------------------------------------

fb::DType dtypeToFb(DType d) {
  const std::string_view name = d == DType::boolean ? fbBoolName : dtypeName(d);
  for (auto v : fb::EnumValuesDType())
    if (fb::EnumNameDType(v) == name) return v;
  TPC_ASSERT(false, "dtype missing from model.fbs: " + std::string(dtypeName(d)));
}

flatbuffers::Offset<void> attrToFb(flatbuffers::FlatBufferBuilder& b, const Attr& a, fb::AttrValue& tag) {
  switch (a.kind()) {
    case AttrKind::Int: tag = fb::AttrValue::IntAttr; return fb::CreateIntAttr(b, a.i()).Union();
    case AttrKind::Float: tag = fb::AttrValue::FloatAttr; return fb::CreateFloatAttr(b, a.f()).Union();
    case AttrKind::Bool: tag = fb::AttrValue::BoolAttr; return fb::CreateBoolAttr(b, a.b()).Union();
    case AttrKind::Str: tag = fb::AttrValue::StringAttr; return fb::CreateStringAttrDirect(b, a.s().c_str()).Union();
    case AttrKind::Ints: tag = fb::AttrValue::IntsAttr; return fb::CreateIntsAttrDirect(b, &a.ints()).Union();
    case AttrKind::DType: tag = fb::AttrValue::DTypeAttr; return fb::CreateDTypeAttr(b, dtypeToFb(a.dtype())).Union();
  }
  TPC_ASSERT(false, "unknown attribute kind");
}

std::string toBuffer(const ModelFile& m) {
  TPC_ASSERT(m.forward, "saving a model without a graph");
  const Graph& g = *m.forward;
  TPC_ASSERT_GRAPH(g, g.mesh().empty(), "model files hold unsharded forward graphs (the graph has a mesh)");
  flatbuffers::FlatBufferBuilder b;
  b.ForceDefaults(true);  // the file states every config field, defaults included

  llvm::DenseMap<const Value*, uint32_t> index;
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  auto addTensor = [&](const Value* v, fb::TensorKind kind) {
    TPC_ASSERT_GRAPH(g, !v->placement(), "model files hold unsharded forward graphs (a value has a placement)");
    index[v] = static_cast<uint32_t>(tensors.size());
    std::vector<int64_t> shape(v->shape().begin(), v->shape().end());
    flatbuffers::Offset<fb::Init> init;
    if (kind == fb::TensorKind::param && !v->init().empty())
      init = fb::CreateInitDirect(b, v->init().kind.c_str(), v->init().args.empty() ? nullptr : &v->init().args);
    tensors.push_back(fb::CreateTensorDirect(b, v->name().c_str(), kind, dtypeToFb(v->dtype()), &shape, init));
  };
  for (const Value* v : g.inputs()) addTensor(v, fb::TensorKind::input);
  for (const Value* v : g.params()) addTensor(v, fb::TensorKind::param);
  std::vector<flatbuffers::Offset<fb::Node>> nodes;
  for (const Node* n : g.nodes()) {
    for (const Value* r : n->results()) addTensor(r, fb::TensorKind::value);
    std::vector<uint32_t> operands, results;
    for (const Value* v : n->operands()) {
      auto it = index.find(v);
      TPC_ASSERT_GRAPH(g, it != index.end(), "operand used before its definition");
      operands.push_back(it->second);
    }
    for (const Value* r : n->results()) results.push_back(index[r]);
    std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
    for (const auto& [name, a] : n->attrs()) {
      fb::AttrValue tag = fb::AttrValue::NONE;
      auto value = attrToFb(b, a, tag);
      attrs.push_back(fb::CreateAttributeDirect(b, name.c_str(), tag, value));
    }
    std::string op(n->opName());
    nodes.push_back(fb::CreateNodeDirect(b, op.c_str(), &operands, &results, attrs.empty() ? nullptr : &attrs));
  }
  std::vector<flatbuffers::Offset<fb::Output>> outputs;
  for (const GraphOutput& o : g.outputs()) {
    auto it = index.find(o.value);
    TPC_ASSERT_GRAPH(g, it != index.end(), "an output is not a value of the graph");
    outputs.push_back(fb::CreateOutputDirect(b, o.name.c_str(), it->second));
  }
  auto graph = fb::CreateGraphDirect(b, g.name().c_str(), &tensors, &nodes, &outputs);

  const TrainConfig& c = m.config;
  auto config = fb::CreateTrainConfigDirect(
      b, c.optimizer.c_str(), c.beta1, c.beta2, c.eps, c.weightDecay, c.clipGrad, c.lr, c.minLr, c.warmupIters,
      c.decayStyle.c_str(), c.decayIters, c.microBatch, c.globalBatch, c.seqLength, c.trainIters, c.dataPath.c_str(),
      c.split.c_str(), c.tokenizer.c_str(), c.tp, c.dp, c.sp, c.logInterval, c.evalInterval, c.evalIters, c.saveInterval,
      c.seed, c.precision.c_str(), c.distributedOptimizer, c.recompute == "none" ? nullptr : c.recompute.c_str());
  fb::Architecture archType = fb::Architecture::NONE;
  flatbuffers::Offset<void> arch;
  if (m.gpt) {
    const GptConfig& a = *m.gpt;
    archType = fb::Architecture::GptArch;
    arch = fb::CreateGptArch(b, a.layers, a.hidden, a.heads, a.vocab, a.paddedVocab, a.positions, a.hiddenDropout,
                             a.attentionDropout, a.layerNormEps, a.initStd)
               .Union();
  }
  std::string producer = std::string("tpc ") + TPC_VERSION;
  auto model = fb::CreateModelDirect(b, kModelFormatVersion, producer.c_str(), graph, m.lossOutput.c_str(), config,
                                     archType, arch);
  fb::FinishModelBuffer(b, model);
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}


}  // namespace

Result<ModelFile> loadModelFromBytes(std::string_view bytes, const std::string& file) {
  if (bytes.size() > kMaxFileBytes) return makeError(file, ": error: the file is larger than ", kMaxFileBytes, " bytes");
  std::vector<uint8_t> buf;
  if (endsWith(file, ".json")) {
    auto parsed = jsonToBuffer(bytes, file, nullptr);
    if (!parsed.ok() && parsed.error().find("required field is missing: graph") != std::string::npos)
      return makeError(parsed.error(), " (a preset or a config, not a model file? 'tpc new gpt --preset NAME -o MODEL.json' "
                       "writes a model file)");
    TPC_ASSIGN(buf, std::move(parsed));
  } else if (endsWith(file, ".fb")) {
    buf.assign(bytes.begin(), bytes.end());  // a fresh, aligned copy
  } else {
    return makeError(file, ": error: unknown model file extension (expected .fb or .json)");
  }
  if (buf.size() < 8 || !fb::ModelBufferHasIdentifier(buf.data()))
    return makeError(file, ": error: not a tpc model file (bad identifier; expected \"TPCM\")");
  flatbuffers::Verifier::Options vopts;
  vopts.max_depth = 16;
  vopts.max_tables = 1u << 22;
  flatbuffers::Verifier verifier(buf.data(), buf.size(), vopts);
  if (!fb::VerifyModelBuffer(verifier))
    return makeError(file, ": error: corrupt or truncated model file (flatbuffers verification failed)");
  auto model = modelFromFb(fb::GetModel(buf.data()));
  if (!model) {
    // Names and strings from the file may hold any bytes; the message stays one printable line.
    std::string msg = model.error();
    for (char& c : msg)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return makeError(file, ": error: ", msg);
  }
  model->forward->setSourceName(file);
  return model;
}

Result<ModelFile> loadModelFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return makeError(path, ": error: is a directory, not a model file (MODEL.fb or MODEL.json; tpc new writes one)");
  // A FIFO would block the open until some writer came; a model file is read whole, from a regular file.
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    return makeError(path, ": error: is not a regular file (a pipe, device or socket); give a model file (MODEL.fb or "
                     "MODEL.json; tpc new writes one)");
  std::ifstream f(path, std::ios::binary);
  if (!f) return makeError(path, ": error: cannot open: ", std::strerror(errno));
  f.seekg(0, std::ios::end);
  std::streamoff size = f.tellg();
  if (size < 0) return makeError(path, ": error: cannot read");
  if (static_cast<size_t>(size) > kMaxFileBytes) return makeError(path, ": error: the file is larger than ", kMaxFileBytes, " bytes");
  f.seekg(0);
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!f.read(bytes.data(), size)) return makeError(path, ": error: cannot read");
  return loadModelFromBytes(bytes, path);
}

Result<std::string> serializeModel(const ModelFile& model, bool json) {
  std::string bin = toBuffer(model);
  if (!json) return bin;
  auto parser = schemaParser();
  const auto* root = flatbuffers::GetRoot<flatbuffers::Table>(bin.data());
  JsonWriter writer;
  std::string text = writer.table(root, *parser->root_struct_def_, 0) + "\n";
  if (!writer.notUtf8().empty())
    return makeError("the field ", writer.notUtf8(), " is not UTF-8, which a .json model file cannot hold; write a .fb "
                     "model file instead, or give the value in UTF-8");
  return text;
}

Status saveModelFile(const ModelFile& model, const std::string& path) {
  bool json = endsWith(path, ".json");
  if (!json && !endsWith(path, ".fb")) return makeError(path, ": error: unknown model file extension (expected .fb or .json)");
  auto bytes = serializeModel(model, json);
  if (!bytes) return makeError(path, ": error: ", bytes.error());
  return writeFileAtomically(path, *bytes);
}

Result<ModelPreset> parsePresetJson(std::string_view json, const std::string& file) {
  TPC_ASSIGN(std::vector<uint8_t> buf, jsonToBuffer(json, file, "Preset"));
  flatbuffers::Verifier verifier(buf.data(), buf.size());
  TPC_ASSERT(verifier.VerifyBuffer<fb::Preset>(nullptr), "the JSON parser made an invalid buffer");
  const fb::Preset* p = flatbuffers::GetRoot<fb::Preset>(buf.data());
  ModelPreset out;
  out.config = configFromFb(p->config());
  auto arch = archFromFb(p->arch_type(), p->arch());
  if (!arch) return makeError(file, ": error: ", arch.error());
  if (!*arch) return makeError(file, ": error: arch is missing");
  out.gpt = **arch;
  if (Status s = validateTrainConfig(out.config); !s.ok()) return makeError(file, ": error: ", s.error());
  if (Status s = validateGpt(out.gpt, out.config); !s.ok()) return makeError(file, ": error: ", s.error());
  return out;
}

}  // namespace tpc
