// Recursive-descent parser for the text form (grammar in printer.cpp's output; see DESIGN.md).
//   graph  := 'graph' @name '(' args ')' ['params' '(' params ')'] ['mesh' '(' axis=size, ... ')'] '{' stmt* '}'
//   stmt   := %r, ... '=' op '(' %a, ... ')' ['{' attr=value, ... '}'] ':' type, ... ['{' 'place' '=' places '}']
//           | 'return' [name=]%v, ...
#include "ir/parser.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <unordered_map>

#include "ir/shape_rules.h"
#include "ir/verifier.h"

namespace tpc {
namespace {

struct Token {
  enum Kind { Ident, ValueRef, GlobalRef, Int, Float, String, Punct, End, Bad } kind = End;
  std::string text;
  Loc loc;
};

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  Token next() {
    skipSpaceAndComments();
    Token t;
    t.loc = {line_, col_};
    if (pos_ >= src_.size()) return t;
    char c = src_[pos_];
    auto isIdent = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.'; };
    if (c == '%' || c == '@') {
      advance();
      size_t start = pos_;
      while (pos_ < src_.size() && isIdent(src_[pos_])) advance();
      t.kind = c == '%' ? Token::ValueRef : Token::GlobalRef;
      t.text = std::string(src_.substr(start, pos_ - start));
      if (t.text.empty()) {
        t.kind = Token::Bad;
        t.text = std::string("expected a name after '") + c + "'";
      }
      return t;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos_;
      while (pos_ < src_.size() && isIdent(src_[pos_])) advance();
      t.kind = Token::Ident;
      t.text = std::string(src_.substr(start, pos_ - start));
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || (c == '-' && pos_ + 1 < src_.size() &&
                                                        (std::isdigit(static_cast<unsigned char>(src_[pos_ + 1])) ||
                                                         src_.substr(pos_ + 1, 3) == "inf"))) {
      size_t start = pos_;
      bool isFloat = false;
      if (c == '-') advance();
      if (src_.substr(pos_, 3) == "inf") {
        for (int k = 0; k < 3; ++k) advance();
        t.kind = Token::Float;
        t.text = std::string(src_.substr(start, pos_ - start));
        return t;
      }
      while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) advance();
      if (pos_ < src_.size() && src_[pos_] == '.') {
        isFloat = true;
        advance();
        while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) advance();
      }
      if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
        isFloat = true;
        advance();
        if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) advance();
        while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) advance();
      }
      t.kind = isFloat ? Token::Float : Token::Int;
      t.text = std::string(src_.substr(start, pos_ - start));
      return t;
    }
    if (c == '"') {
      advance();
      std::string s;
      while (pos_ < src_.size() && src_[pos_] != '"' && src_[pos_] != '\n') {
        if (src_[pos_] == '\\' && pos_ + 1 < src_.size()) advance();
        s += src_[pos_];
        advance();
      }
      if (pos_ >= src_.size() || src_[pos_] != '"') {
        t.kind = Token::Bad;
        t.text = "unterminated string";
        return t;
      }
      advance();
      t.kind = Token::String;
      t.text = std::move(s);
      return t;
    }
    if (std::string_view("()[]{},:=?").find(c) != std::string_view::npos) {
      advance();
      t.kind = Token::Punct;
      t.text = std::string(1, c);
      return t;
    }
    t.kind = Token::Bad;
    t.text = std::isprint(static_cast<unsigned char>(c)) ? std::string("unexpected character '") + c + "'"
                                                         : "unexpected byte " + std::to_string(static_cast<unsigned char>(c));
    advance();
    return t;
  }

 private:
  void advance() {
    if (src_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  void skipSpaceAndComments() {
    while (pos_ < src_.size()) {
      char c = src_[pos_];
      if (std::isspace(static_cast<unsigned char>(c))) {
        advance();
      } else if (c == '/' && pos_ + 1 < src_.size() && src_[pos_ + 1] == '/') {
        while (pos_ < src_.size() && src_[pos_] != '\n') advance();
      } else {
        break;
      }
    }
  }
  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

std::string describe(const Token& t) {
  switch (t.kind) {
    case Token::End: return "end of input";
    case Token::ValueRef: return "'%" + t.text + "'";
    case Token::GlobalRef: return "'@" + t.text + "'";
    case Token::String: return "string \"" + t.text + "\"";
    default: return "'" + t.text + "'";
  }
}

class Parser {
 public:
  Parser(std::string_view text, std::string fileName) : lex_(text), file_(std::move(fileName)) { tok_ = lex_.next(); }

  Result<std::unique_ptr<Graph>> parse() {
    auto g = std::make_unique<Graph>();
    g->setSourceName(file_);
    graph_ = g.get();
    TPC_TRY(expectIdent("graph"));
    if (tok_.kind != Token::GlobalRef) return err("expected the graph name (@name), got " + describe(tok_));
    g->setName(tok_.text);
    bump();
    TPC_TRY(expectPunct("("));
    if (!isPunct(")")) {
      do {
        TPC_TRY(parseArg(false));
      } while (acceptPunct(","));
    }
    TPC_TRY(expectPunct(")"));
    if (isIdent("params")) {
      bump();
      TPC_TRY(expectPunct("("));
      if (!isPunct(")")) {
        do {
          TPC_TRY(parseArg(true));
        } while (acceptPunct(","));
      }
      TPC_TRY(expectPunct(")"));
    }
    if (isIdent("mesh")) TPC_TRY(parseMesh());
    TPC_TRY(expectPunct("{"));
    while (!isIdent("return")) {
      if (tok_.kind == Token::End) return err("expected 'return' before the end of the graph");
      TPC_TRY(parseNode());
    }
    TPC_TRY(parseReturn());
    TPC_TRY(expectPunct("}"));
    if (tok_.kind != Token::End) return err("unexpected " + describe(tok_) + " after the graph (one graph per input)");
    TPC_TRY(verifyGraph(*g));
    return g;
  }

 private:
  // ---- token helpers ----
  void bump() { tok_ = lex_.next(); }
  bool isPunct(const char* p) const { return tok_.kind == Token::Punct && tok_.text == p; }
  bool isIdent(const char* p) const { return tok_.kind == Token::Ident && tok_.text == p; }
  bool acceptPunct(const char* p) {
    if (!isPunct(p)) return false;
    bump();
    return true;
  }
  Error errAt(Loc l, const std::string& msg) const {
    return makeError(file_, ":", l.line, ":", l.col, ": error: ", msg);
  }
  Error err(const std::string& msg) const {
    if (tok_.kind == Token::Bad) return errAt(tok_.loc, tok_.text);
    return errAt(tok_.loc, msg);
  }
  Status expectPunct(const char* p) {
    if (!acceptPunct(p)) return err(std::string("expected '") + p + "', got " + describe(tok_));
    return {};
  }
  Status expectIdent(const char* w) {
    if (!isIdent(w)) return err(std::string("expected '") + w + "', got " + describe(tok_));
    bump();
    return {};
  }
  Result<int64_t> parseInt(const char* what) {
    if (tok_.kind != Token::Int) return err(std::string("expected ") + what + " (an integer), got " + describe(tok_));
    errno = 0;
    long long v = std::strtoll(tok_.text.c_str(), nullptr, 10);
    if (errno == ERANGE) return err(std::string(what) + " " + tok_.text + " is out of range");
    bump();
    return static_cast<int64_t>(v);
  }
  Result<double> parseNumber(const char* what) {
    if (tok_.kind == Token::Ident && (tok_.text == "inf" || tok_.text == "nan")) {
      double v = tok_.text == "inf" ? HUGE_VAL : std::nan("");
      bump();
      return v;
    }
    if (tok_.kind != Token::Int && tok_.kind != Token::Float)
      return err(std::string("expected ") + what + " (a number), got " + describe(tok_));
    double v = std::strtod(tok_.text.c_str(), nullptr);
    bump();
    return v;
  }

  // ---- types and placements ----
  Result<TensorType> parseType() {
    Loc typeLoc = tok_.loc;
    if (tok_.kind != Token::Ident) return err("expected a tensor type like f32[8,768], got " + describe(tok_));
    auto dt = parseDType(tok_.text);
    if (!dt) return err("unknown dtype '" + tok_.text + "' (expected f32, f64, f16, bf16, i32, i64 or bool)");
    bump();
    TPC_TRY(expectPunct("["));
    Shape shape;
    if (!isPunct("]")) {
      do {
        Loc l = tok_.loc;
        TPC_ASSIGN(int64_t d, parseInt("a dimension"));
        if (d < 0) return errAt(l, "negative dimension " + std::to_string(d));
        shape.push_back(d);
      } while (acceptPunct(","));
    }
    if (numelOverflows(shape)) return errAt(typeLoc, "tensor shape " + shapeStr(shape) + " has too many elements (the count overflows int64)");
    TPC_TRY(expectPunct("]"));
    return TensorType(*dt, shape);
  }

  Result<Placement> parsePlacement() {
    TPC_TRY(expectPunct("["));
    Placement p;
    if (!isPunct("]")) {
      do {
        if (tok_.kind != Token::Ident) return err("expected a mesh axis name in the placement, got " + describe(tok_));
        std::string axis = tok_.text;
        Loc l = tok_.loc;
        bump();
        TPC_TRY(expectPunct(":"));
        if (tok_.kind != Token::Ident || (tok_.text != "R" && tok_.text != "P" && tok_.text != "S"))
          return err("expected R, S(dim) or P, got " + describe(tok_));
        AxisPlacement ap;
        if (tok_.text == "R") ap = AxisPlacement::replicated();
        if (tok_.text == "P") ap = AxisPlacement::partial();
        bool split = tok_.text == "S";
        bump();
        if (split) {
          TPC_TRY(expectPunct("("));
          TPC_ASSIGN(int64_t d, parseInt("the split dimension"));
          TPC_TRY(expectPunct(")"));
          ap = AxisPlacement::split(d);
        }
        for (const auto& [name, q] : p.axes)
          if (name == axis) return errAt(l, "mesh axis '" + axis + "' appears twice in one placement");
        p.axes.emplace_back(axis, ap);
      } while (acceptPunct(","));
    }
    TPC_TRY(expectPunct("]"));
    return p;
  }

  Result<InitSpec> parseInit() {
    if (tok_.kind != Token::Ident) return err("expected an initializer like normal(0.02), got " + describe(tok_));
    InitSpec init;
    init.kind = tok_.text;
    Loc l = tok_.loc;
    bump();
    if (acceptPunct("(")) {
      if (!isPunct(")")) {
        do {
          TPC_ASSIGN(double v, parseNumber("an initializer argument"));
          init.args.push_back(v);
        } while (acceptPunct(","));
      }
      TPC_TRY(expectPunct(")"));
    }
    if (Status s = validateInit(init); !s.ok()) return errAt(l, s.error());
    return init;
  }

  // ---- header ----
  Status defineName(const std::string& name, Value* v, Loc l) {
    if (!defined_.emplace(name, v).second) return errAt(l, "value %" + name + " is defined twice");
    return {};
  }

  Status parseArg(bool isParam) {
    if (tok_.kind != Token::ValueRef)
      return err(std::string("expected ") + (isParam ? "a parameter" : "an input") + " (%name), got " + describe(tok_));
    std::string name = tok_.text;
    Loc l = tok_.loc;
    bump();
    TPC_TRY(expectPunct(":"));
    TPC_ASSIGN(TensorType t, parseType());
    Value* v = isParam ? graph_->addParam(name, t) : graph_->addInput(name, t);
    v->setLoc(l);
    TPC_TRY(defineName(name, v, l));
    while (tok_.kind == Token::Ident && (tok_.text == "init" || tok_.text == "place")) {
      bool init = tok_.text == "init";
      if (init && !isParam) return err("only parameters have an initializer ('init=')");
      bump();
      TPC_TRY(expectPunct("="));
      if (init) {
        TPC_ASSIGN(InitSpec spec, parseInit());
        v->setInit(spec);
      } else {
        TPC_ASSIGN(Placement p, parsePlacement());
        v->setPlacement(p);
      }
    }
    return {};
  }

  Status parseMesh() {
    bump();
    TPC_TRY(expectPunct("("));
    Mesh mesh;
    do {
      if (tok_.kind != Token::Ident) return err("expected a mesh axis like tp=4, got " + describe(tok_));
      std::string name = tok_.text;
      Loc l = tok_.loc;
      bump();
      TPC_TRY(expectPunct("="));
      Loc sl = tok_.loc;
      TPC_ASSIGN(int64_t size, parseInt("the axis size"));
      if (size < 1) return errAt(sl, "mesh axis '" + name + "' must have size >= 1, got " + std::to_string(size));
      if (mesh.axisIndex(name) >= 0) return errAt(l, "mesh axis '" + name + "' is declared twice");
      mesh.axes.push_back({name, size});
    } while (acceptPunct(","));
    TPC_TRY(expectPunct(")"));
    graph_->setMesh(mesh);
    return {};
  }

  // ---- body ----
  Result<Attr> parseAttrValue(const OpInfo& info, const std::string& name, Loc l) {
    const AttrSpec* spec = info.findAttr(name);
    if (!spec) {
      std::string known;
      for (const AttrSpec& a : info.attrs) known += (known.empty() ? "" : ", ") + a.name;
      return errAt(l, std::string(info.name) + " has no attribute '" + name + "'" +
                          (known.empty() ? " (it takes none)" : " (it takes: " + known + ")"));
    }
    auto mismatch = [&]() {
      return err(std::string(info.name) + ": attribute '" + name + "' must be " +
                 std::string(attrKindName(spec->kind)) + ", got " + describe(tok_));
    };
    switch (spec->kind) {
      case AttrKind::Int: {
        if (tok_.kind != Token::Int) return mismatch();
        TPC_ASSIGN(int64_t v, parseInt("an integer"));
        return Attr(v);
      }
      case AttrKind::Float: {
        if (tok_.kind != Token::Int && tok_.kind != Token::Float && !isIdent("inf") && !isIdent("nan")) return mismatch();
        TPC_ASSIGN(double v, parseNumber("a float"));
        return Attr(v);
      }
      case AttrKind::Bool: {
        if (!isIdent("true") && !isIdent("false")) return mismatch();
        bool v = tok_.text == "true";
        bump();
        return Attr(v);
      }
      case AttrKind::Str: {
        if (tok_.kind != Token::Ident && tok_.kind != Token::String) return mismatch();
        std::string v = tok_.text;
        bump();
        return Attr(v);
      }
      case AttrKind::Ints: {
        if (!isPunct("[")) return mismatch();
        bump();
        std::vector<int64_t> v;
        if (!isPunct("]")) {
          do {
            TPC_ASSIGN(int64_t x, parseInt("a list element"));
            v.push_back(x);
          } while (acceptPunct(","));
        }
        TPC_TRY(expectPunct("]"));
        return Attr(v);
      }
      case AttrKind::DType: {
        if (tok_.kind != Token::Ident || !parseDType(tok_.text)) return mismatch();
        DType d = *parseDType(tok_.text);
        bump();
        return Attr(d);
      }
    }
    return mismatch();
  }

  Status parseNode() {
    std::vector<std::pair<std::string, Loc>> resultNames;
    Loc nodeLoc = tok_.loc;
    do {
      if (tok_.kind != Token::ValueRef) return err("expected a result name (%name) or 'return', got " + describe(tok_));
      resultNames.emplace_back(tok_.text, tok_.loc);
      bump();
    } while (acceptPunct(","));
    TPC_TRY(expectPunct("="));
    if (tok_.kind != Token::Ident) return err("expected an op name, got " + describe(tok_));
    auto op = lookupOp(tok_.text);
    if (!op) return err("unknown op '" + tok_.text + "'");
    const OpInfo& info = opInfo(*op);
    Loc opLoc = tok_.loc;
    bump();
    TPC_TRY(expectPunct("("));
    llvm::SmallVector<Value*, 4> operands;
    if (!isPunct(")")) {
      do {
        if (tok_.kind != Token::ValueRef) return err("expected an operand (%name), got " + describe(tok_));
        auto it = defined_.find(tok_.text);
        if (it == defined_.end()) return err("use of undefined value %" + tok_.text);
        operands.push_back(it->second);
        bump();
      } while (acceptPunct(","));
    }
    TPC_TRY(expectPunct(")"));
    if (info.numOperands >= 0 && static_cast<int>(operands.size()) != info.numOperands)
      return errAt(opLoc, std::string(info.name) + " takes " + std::to_string(info.numOperands) + " operand(s), got " +
                              std::to_string(operands.size()));
    if (info.numOperands < 0 && operands.empty()) return errAt(opLoc, std::string(info.name) + " takes at least one operand");
    AttrDict attrs;
    if (acceptPunct("{")) {
      if (!isPunct("}")) {
        do {
          if (tok_.kind != Token::Ident) return err("expected an attribute name, got " + describe(tok_));
          std::string name = tok_.text;
          Loc l = tok_.loc;
          bump();
          if (attrs.find(name)) return errAt(l, "attribute '" + name + "' is given twice");
          TPC_TRY(expectPunct("="));
          TPC_ASSIGN(Attr a, parseAttrValue(info, name, l));
          attrs.set(name, a);
        } while (acceptPunct(","));
      }
      TPC_TRY(expectPunct("}"));
    }
    if (Status s = checkAttrs(*op, attrs); !s.ok()) return errAt(opLoc, s.error());
    TPC_TRY(expectPunct(":"));
    std::vector<TensorType> types;
    do {
      TPC_ASSIGN(TensorType t, parseType());
      types.push_back(t);
    } while (acceptPunct(","));
    if (info.numResults >= 0 && static_cast<int>(resultNames.size()) != info.numResults)
      return errAt(nodeLoc, std::string(info.name) + " has " + std::to_string(info.numResults) + " result(s), but " +
                                std::to_string(resultNames.size()) + " name(s) are bound");
    if (types.size() != resultNames.size())
      return errAt(nodeLoc, std::to_string(resultNames.size()) + " result(s) but " + std::to_string(types.size()) +
                                " type(s) given");
    std::vector<std::optional<Placement>> places(types.size());
    if (acceptPunct("{")) {
      TPC_TRY(expectIdent("place"));
      TPC_TRY(expectPunct("="));
      if (acceptPunct("(")) {
        // One entry per result: a placement or '?' (none).
        auto countError = [&](const char* howMany) {
          return err(cat(info.name, " has ", types.size(), " result(s), but the placement lists ", howMany,
                         " (one [...] or ? per result)"));
        };
        size_t i = 0;
        do {
          if (i == types.size()) return countError("more");
          if (!acceptPunct("?")) {
            TPC_ASSIGN(Placement p, parsePlacement());
            places[i] = p;
          }
          ++i;
        } while (acceptPunct(","));
        if (i != types.size()) return countError(std::to_string(i).c_str());
        TPC_TRY(expectPunct(")"));
      } else {
        if (types.size() != 1) return err("a node with several results lists placements as ([...], [...])");
        TPC_ASSIGN(Placement p, parsePlacement());
        places[0] = p;
      }
      TPC_TRY(expectPunct("}"));
    }
    Node* n = graph_->createWithTypes(*op, operands, std::move(attrs), types);
    n->setLoc(opLoc);
    for (size_t i = 0; i < resultNames.size(); ++i) {
      n->result(i)->setName(resultNames[i].first);
      n->result(i)->setPlacement(places[i]);
      TPC_TRY(defineName(resultNames[i].first, n->result(i), resultNames[i].second));
    }
    return {};
  }

  Status parseReturn() {
    bump();
    if (isPunct("}")) return {};
    do {
      std::string outName;
      // A name that is not an identifier (e.g. "2b") is printed quoted.
      if (tok_.kind == Token::Ident || tok_.kind == Token::String) {
        outName = tok_.text;
        bump();
        TPC_TRY(expectPunct("="));
      }
      if (tok_.kind != Token::ValueRef) return err("expected a returned value (%name), got " + describe(tok_));
      auto it = defined_.find(tok_.text);
      if (it == defined_.end()) return err("return of undefined value %" + tok_.text);
      // Outputs are found by name (autodiff's loss=, a parameter's update): two of one name would be one of them.
      // (An unnamed value's number is no name: `return %3, %3`, which CSE can make, is two outputs of one value.)
      const std::string effective = !outName.empty() ? outName : it->second->hasName() ? it->second->name() : "";
      for (size_t i = 0; i < graph_->outputs().size(); ++i)
        if (!effective.empty() && graph_->outputName(i) == effective)
          return err("two outputs are named '" + effective + "'; give each its own name (NAME=%value)");
      graph_->addOutput(it->second, outName);
      bump();
    } while (acceptPunct(","));
    return {};
  }

  Lexer lex_;
  std::string file_;
  Token tok_;
  Graph* graph_ = nullptr;
  std::unordered_map<std::string, Value*> defined_;
};

}  // namespace

bool holdsNoGraph(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = std::min(text.find('\n', pos), text.size());
    const size_t first = text.find_first_not_of(" \t\r", pos);
    if (first < nl && text.compare(first, 2, "//") != 0) return false;
    pos = nl + 1;
  }
  return true;
}

Result<std::unique_ptr<Graph>> parseGraph(std::string_view text, const std::string& fileName) {
  Parser p(text, fileName);
  return p.parse();
}

Result<std::string> readTextFile(const std::string& path) {
  if (path == "-") {
    std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    return s;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return makeError(path, ": error: is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) return makeError(path, ": error: cannot open file: ", std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<std::unique_ptr<Graph>> parseGraphFile(const std::string& path) {
  TPC_ASSIGN(std::string text, readTextFile(path));
  return parseGraph(text, path == "-" ? "<stdin>" : path);
}

}  // namespace tpc
