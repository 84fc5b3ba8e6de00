// tokenizer.json -> HfTokenizer, and Tokenizer::from_file / from_json. Every unsupported or
// malformed part is an InputError naming the file and the field.
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "actcap/error.h"
#include "actcap/tokenizer.h"
#include "io/text_file.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

namespace actcap {
namespace tok {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxId = int64_t{1} << 24;

std::string show(const json& j) {
  std::string s = j.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// The parsed document, with model.vocab and model.merges streamed straight into the BPE's
// containers (a DOM of Llama 3's 128k-entry vocab and 280k merges costs more than the rest of the
// load together).
struct Loaded {
  json doc;
  bool has_vocab = false;
  Bpe::Vocab vocab;
  bool has_merges = false;
  Bpe::Merges merges;
};

class Sax {
 public:
  Sax(Loaded& out, std::string origin) : out_(out), origin_(std::move(origin)) {}

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(json::number_integer_t v) {
    if (mode_ == Mode::Vocab) return vocab_id(v, json(v));
    return value(v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::Vocab)
      return vocab_id(v > static_cast<uint64_t>(kMaxId) ? kMaxId : static_cast<int64_t>(v),
                      json(v));
    return value(v);
  }
  bool number_float(json::number_float_t v, const std::string&) { return value(v); }
  bool string(std::string& v) {
    if (mode_ == Mode::Merges) {
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        bad_merge(json(v), " must be two tokens separated by one space");
      out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode_ == Mode::MergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return value(std::move(v));
  }
  bool binary(json::binary_t& v) { return value(json::binary(v)); }
  bool start_object(std::size_t) {
    if (mode_ == Mode::Dom && in_model() && key_ == "vocab") {
      mode_ = Mode::Vocab;
      out_.has_vocab = true;
      return true;
    }
    if (mode_ != Mode::Dom) return streamed_container();
    open(json::object());
    return true;
  }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::Dom;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    if (mode_ == Mode::Dom && in_model() && key_ == "merges") {
      mode_ = Mode::Merges;
      out_.has_merges = true;
      return true;
    }
    if (mode_ == Mode::Merges) {
      mode_ = Mode::MergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::Dom) return streamed_container();
    open(json::array());
    return true;
  }
  bool end_array() {
    if (mode_ == Mode::Merges) {
      mode_ = Mode::Dom;
      return true;
    }
    if (mode_ == Mode::MergePair) {
      if (pair_.size() != 2) bad_merge(json(pair_), " must be \"a b\" or [\"a\", \"b\"]");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::Merges;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw InputError(concat(origin_, ": not valid JSON (", e.what(), ")"));
  }

 private:
  enum class Mode { Dom, Vocab, Merges, MergePair };

  bool in_model() const { return stack_.size() == 2 && keys_[1] == "model"; }

  // Places v in the current container; returns it.
  json* place(json v) {
    if (stack_.empty()) {
      out_.doc = std::move(v);
      return &out_.doc;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json v) {
    if (mode_ == Mode::Vocab) vocab_id(-1, v);
    if (mode_ == Mode::Merges || mode_ == Mode::MergePair)
      bad_merge(v, " must be \"a b\" or [\"a\", \"b\"]");
    place(std::move(v));
    return true;
  }
  void open(json container) {
    const std::string k = stack_.empty() || stack_.back()->is_array() ? std::string() : key_;
    stack_.push_back(place(std::move(container)));
    keys_.push_back(k);
  }
  bool streamed_container() {
    if (mode_ == Mode::Vocab)
      throw InputError(concat(origin_, ": model.vocab[\"", key_, "\"] must be a token id"));
    bad_merge(json("(nested)"), " must be \"a b\" or [\"a\", \"b\"]");
  }
  bool vocab_id(int64_t v, const json& shown) {
    if (v < 0 || v >= kMaxId || !shown.is_number_integer())
      throw InputError(concat(origin_, ": model.vocab[\"", key_, "\"] must be a token id (0..",
                              kMaxId - 1, "), not ", show(shown)));
    out_.vocab[key_] = static_cast<int32_t>(v);
    return true;
  }
  [[noreturn]] void bad_merge(const json& shown, const char* what) {
    throw InputError(
        concat(origin_, ": model.merges[", out_.merges.size(), "] ", show(shown), what));
  }

  Loaded& out_;
  std::string origin_;
  Mode mode_ = Mode::Dom;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // the key each open container sits under ("" in an array)
  std::string key_;
  std::vector<std::string> pair_;
};

class Parser {
 public:
  explicit Parser(std::string origin) : origin_(std::move(origin)) {}

  HfParts parse(Loaded& loaded) {
    loaded_ = &loaded;
    const json& root = loaded.doc;
    if (!root.is_object()) fail("", "the top level must be a JSON object");
    HfParts parts;
    const json* model = find(root, "model");
    if (model == nullptr) fail("model", "is missing");

    parts.normalizers = normalizers(member(root, "normalizer"), "normalizer");
    bool byte_level_seen = false;
    parts.pre_tokenizer =
        pre_tokenizer(member(root, "pre_tokenizer"), "pre_tokenizer", byte_level_seen);
    parts.added_tokens = added_tokens(member(root, "added_tokens"));
    parts.model = bpe(*model, parts.pre_tokenizer && parts.pre_tokenizer->byte_level());
    parts.post = post_processor(member(root, "post_processor"), "post_processor");
    decoders(member(root, "decoder"), "decoder", parts.decoders);
    return parts;
  }

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
    if (field.empty()) throw InputError(concat(origin_, ": ", msg));
    throw InputError(concat(origin_, ": ", field, " ", msg));
  }

  static const json* find(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  // A missing key reads as null.
  static const json& member(const json& obj, const char* key) {
    static const json null_json;
    const json* j = find(obj, key);
    return j ? *j : null_json;
  }
  const json& object(const json& j, const std::string& field) const {
    if (!j.is_object()) fail(field, concat("must be an object, not ", show(j)));
    return j;
  }
  std::string type(const json& j, const std::string& field) const {
    object(j, field);
    const json& t = member(j, "type");
    if (!t.is_string()) fail(field + ".type", "is missing or not a string");
    return t.get<std::string>();
  }
  [[noreturn]] void unsupported_type(const std::string& field, const std::string& t,
                                     const char* supported) const {
    fail(field + ".type", concat("\"", t, "\" is not supported; supported: ", supported));
  }
  bool flag(const json& obj, const char* key, const std::string& field, bool dflt) const {
    const json& v = member(obj, key);
    if (v.is_null()) return dflt;
    if (!v.is_boolean()) fail(field + "." + key, concat("must be true or false, not ", show(v)));
    return v.get<bool>();
  }
  std::string text(const json& j, const std::string& field) const {
    if (!j.is_string()) fail(field, concat("must be a string, not ", show(j)));
    return j.get<std::string>();
  }
  int64_t id(const json& j, const std::string& field) const {
    if (!j.is_number_integer()) fail(field, concat("must be a token id, not ", show(j)));
    const int64_t v = j.get<int64_t>();
    if (v < 0 || v >= kMaxId)
      fail(field, concat("id ", v, " is out of range (0..", kMaxId - 1, ")"));
    return v;
  }

  // ---- normalizer ----
  Pattern pattern(const json& j, const std::string& field) const {
    const std::string pfield = field + ".pattern";
    const json& p = member(j, "pattern");
    object(p, pfield);
    Pattern out;
    if (const json* r = find(p, "Regex"))
      out.regex = std::make_shared<const Regex>(text(*r, pfield + ".Regex"),
                                                concat(origin_, ": ", pfield, ".Regex"));
    else if (const json* str = find(p, "String"))
      out.literal = text(*str, pfield + ".String");
    else
      fail(pfield, concat("must be {\"Regex\": ...} or {\"String\": ...}, not ", show(p)));
    return out;
  }

  std::vector<Normalizer> normalizers(const json& j, const std::string& field) const {
    std::vector<Normalizer> out;
    if (j.is_null()) return out;
    const std::string t = type(j, field);
    Normalizer n;
    if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
      n.form = t == "NFC"    ? NormalForm::NFC
               : t == "NFD"  ? NormalForm::NFD
               : t == "NFKC" ? NormalForm::NFKC
                             : NormalForm::NFKD;
      return {n};
    }
    if (t == "Prepend") {
      n.kind = Normalizer::Kind::Prepend;
      n.content = text(member(j, "prepend"), field + ".prepend");
      return {n};
    }
    if (t == "Replace") {
      n.kind = Normalizer::Kind::Replace;
      n.pattern = pattern(j, field);
      n.content = text(member(j, "content"), field + ".content");
      return {n};
    }
    if (t == "Strip") {
      n.kind = Normalizer::Kind::Strip;
      n.strip_left = flag(j, "strip_left", field, false);
      n.strip_right = flag(j, "strip_right", field, false);
      return {n};
    }
    if (t == "Lowercase") {
      n.kind = Normalizer::Kind::Lowercase;
      return {n};
    }
    if (t == "Sequence") {
      const json& list = member(j, "normalizers");
      if (!list.is_array()) fail(field + ".normalizers", "must be an array");
      for (size_t i = 0; i < list.size(); ++i)
        for (Normalizer& f : normalizers(list[i], concat(field, ".normalizers[", i, "]")))
          out.push_back(std::move(f));
      return out;
    }
    unsupported_type(
        field, t, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Lowercase, Sequence (or null)");
  }

  // ---- pre-tokenizer ----
  SplitBehavior behavior(const json& j, const std::string& field) const {
    const std::string b = text(j, field);
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    fail(field, concat("\"", b,
                       "\" is not a split behavior (Removed, Isolated, MergedWithPrevious, "
                       "MergedWithNext, Contiguous)"));
  }

  std::unique_ptr<PreTokenizer> pre_tokenizer(const json& j, const std::string& field,
                                              bool& byte_level_seen) const {
    if (j.is_null()) return nullptr;
    const std::string t = type(j, field);
    if (t == "ByteLevel") {
      if (byte_level_seen)
        fail(field, "is a second ByteLevel pre-tokenizer; only one is supported");
      byte_level_seen = true;
      return std::make_unique<ByteLevelPreTokenizer>(flag(j, "add_prefix_space", field, true),
                                                     flag(j, "use_regex", field, true));
    }
    if (t == "Split") {
      if (byte_level_seen)
        fail(field,
             "is a Split after ByteLevel, which is not supported (it would match the "
             "byte-level characters)");
      const json& pattern = member(j, "pattern");
      const std::string pfield = field + ".pattern";
      object(pattern, pfield);
      std::unique_ptr<Regex> regex;
      std::optional<std::string> literal;
      if (const json* r = find(pattern, "Regex")) {
        regex = std::make_unique<Regex>(text(*r, pfield + ".Regex"),
                                        concat(origin_, ": ", pfield, ".Regex"));
      } else if (const json* s = find(pattern, "String")) {
        literal = text(*s, pfield + ".String");
        // Rust compiles regex::escape(s); for "" that is the empty regex, which matches between
        // every two characters
        if (literal->empty()) {
          regex = std::make_unique<Regex>("", concat(origin_, ": ", pfield, ".String"));
          literal.reset();
        }
      } else {
        fail(pfield, concat("must be {\"Regex\": ...} or {\"String\": ...}, not ", show(pattern)));
      }
      return std::make_unique<SplitPreTokenizer>(
          std::move(regex), std::move(literal),
          behavior(member(j, "behavior"), field + ".behavior"), flag(j, "invert", field, false));
    }
    if (t == "Digits") {
      if (byte_level_seen)
        fail(field,
             "is a Digits after ByteLevel, which is not supported (it would see the "
             "byte-level characters)");
      return std::make_unique<DigitsPreTokenizer>(flag(j, "individual_digits", field, false));
    }
    if (t == "Metaspace") {
      if (byte_level_seen) fail(field, "is a Metaspace after ByteLevel, which is not supported");
      std::string replacement = "\xE2\x96\x81";  // U+2581
      const json& r = member(j, "replacement");
      if (!r.is_null()) replacement = text(r, field + ".replacement");
      if (utf8_char_count(replacement) != 1)
        fail(field + ".replacement", concat("must be one character, not ", show(r)));
      PrependScheme scheme = PrependScheme::Always;
      const json& ps = member(j, "prepend_scheme");
      if (!ps.is_null()) {
        const std::string v = text(ps, field + ".prepend_scheme");
        if (v == "always")
          scheme = PrependScheme::Always;
        else if (v == "first")
          scheme = PrependScheme::First;
        else if (v == "never")
          scheme = PrependScheme::Never;
        else
          fail(field + ".prepend_scheme",
               concat("\"", v, "\" is not supported; supported: always, first, never"));
      } else if (!flag(j, "add_prefix_space", field, true)) {  // the older spelling
        scheme = PrependScheme::Never;
      }
      return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme,
                                                     flag(j, "split", field, true));
    }
    if (t == "Sequence") {
      const json& list = member(j, "pretokenizers");
      if (!list.is_array()) fail(field + ".pretokenizers", "must be an array");
      std::vector<std::unique_ptr<PreTokenizer>> steps;
      for (size_t i = 0; i < list.size(); ++i) {
        auto step =
            pre_tokenizer(list[i], concat(field, ".pretokenizers[", i, "]"), byte_level_seen);
        if (step) steps.push_back(std::move(step));
      }
      return std::make_unique<SequencePreTokenizer>(std::move(steps));
    }
    unsupported_type(field, t, "ByteLevel, Split, Digits, Metaspace, Sequence (or null)");
  }

  // ---- added tokens ----
  std::vector<AddedToken> added_tokens(const json& j) const {
    std::vector<AddedToken> out;
    if (j.is_null()) return out;
    if (!j.is_array()) fail("added_tokens", "must be an array");
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string field = concat("added_tokens[", i, "]");
      const json& t = object(j[i], field);
      AddedToken a;
      a.content = text(member(t, "content"), field + ".content");
      a.id = id(member(t, "id"), field + ".id");
      a.special = flag(t, "special", field, false);
      a.single_word = flag(t, "single_word", field, false);
      a.lstrip = flag(t, "lstrip", field, false);
      a.rstrip = flag(t, "rstrip", field, false);
      a.normalized = flag(t, "normalized", field, !a.special);
      if (a.content.empty()) continue;  // ignored, as in Rust
      out.push_back(std::move(a));
    }
    return out;
  }

  // ---- model ----
  std::unique_ptr<Bpe> bpe(const json& m, bool byte_level) const {
    const std::string t = type(m, "model");
    if (t != "BPE") unsupported_type("model", t, "BPE");
    const json& dropout = member(m, "dropout");
    if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0))
      fail("model.dropout", concat(show(dropout), " is not supported (only null or 0)"));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json& v = member(m, key);
      if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty()))
        fail(concat("model.", key), concat(show(v), " is not supported (only null or \"\")"));
    }
    BpeOptions opts;
    const json& unk = member(m, "unk_token");
    if (!unk.is_null()) opts.unk_token = text(unk, "model.unk_token");
    opts.fuse_unk = flag(m, "fuse_unk", "model", false);
    opts.byte_fallback = flag(m, "byte_fallback", "model", false);
    opts.ignore_merges = flag(m, "ignore_merges", "model", false);
    opts.byte_level = byte_level;

    // model.vocab / model.merges were streamed by Sax when they had the right JSON type; what is
    // left in the document is a wrong type (or nothing).
    if (!loaded_->has_vocab) fail("model.vocab", "must be an object of token -> id");
    if (!loaded_->has_merges && !member(m, "merges").is_null())
      fail("model.merges", "must be an array");
    return std::make_unique<Bpe>(std::move(loaded_->vocab), loaded_->merges, std::move(opts),
                                 origin_ + ": model");
  }

  // ---- post-processor ----
  std::vector<PostStep> post_processor(const json& j, const std::string& field) const {
    std::vector<PostStep> out;
    if (j.is_null()) return out;
    const std::string t = type(j, field);
    if (t == "ByteLevel") return out;  // offsets only; ids are unchanged
    if (t == "TemplateProcessing") {
      const json& single = member(j, "single");
      if (!single.is_array()) fail(field + ".single", "must be an array");
      const json& specials = member(j, "special_tokens");
      PostStep step;
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string ifield = concat(field, ".single[", i, "]");
        const json& item = object(single[i], ifield);
        if (const json* s = find(item, "Sequence")) {
          const std::string sid =
              text(member(object(*s, ifield + ".Sequence"), "id"), ifield + ".Sequence.id");
          if (sid != "A")
            fail(ifield + ".Sequence.id", concat("\"", sid,
                                                 "\" is not supported in the single "
                                                 "template (only \"A\")"));
          step.items.push_back({true, {}});
        } else if (const json* s = find(item, "SpecialToken")) {
          const std::string name =
              text(member(object(*s, ifield + ".SpecialToken"), "id"), ifield + ".SpecialToken.id");
          const json* entry = specials.is_object() ? find(specials, name.c_str()) : nullptr;
          if (entry == nullptr)
            fail(field + ".special_tokens",
                 concat("has no entry \"", name, "\" (used by ", ifield, ")"));
          const json& ids = member(object(*entry, field + ".special_tokens." + name), "ids");
          if (!ids.is_array())
            fail(concat(field, ".special_tokens.", name, ".ids"), "must be an array of ids");
          PostStep::Item it;
          for (size_t k = 0; k < ids.size(); ++k)
            it.ids.push_back(id(ids[k], concat(field, ".special_tokens.", name, ".ids[", k, "]")));
          step.items.push_back(std::move(it));
        } else {
          fail(ifield,
               concat("must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, not ", show(item)));
        }
      }
      out.push_back(std::move(step));
      return out;
    }
    if (t == "BertProcessing" || t == "RobertaProcessing") {
      auto special = [&](const char* key) {
        const json& p = member(j, key);
        if (!p.is_array() || p.size() != 2 || !p[0].is_string())
          fail(concat(field, ".", key), concat("must be [\"token\", id], not ", show(p)));
        return id(p[1], concat(field, ".", key, "[1]"));
      };
      PostStep step;
      step.items.push_back({false, {special("cls")}});
      step.items.push_back({true, {}});
      step.items.push_back({false, {special("sep")}});
      out.push_back(std::move(step));
      return out;
    }
    if (t == "Sequence") {
      const json& list = member(j, "processors");
      if (!list.is_array()) fail(field + ".processors", "must be an array");
      for (size_t i = 0; i < list.size(); ++i)
        for (PostStep& s : post_processor(list[i], concat(field, ".processors[", i, "]")))
          out.push_back(std::move(s));
      return out;
    }
    unsupported_type(field, t,
                     "ByteLevel, TemplateProcessing, BertProcessing, RobertaProcessing, Sequence "
                     "(or null)");
  }

  // ---- decoder ----
  size_t count(const json& obj, const char* key, const std::string& field) const {
    const json& v = member(obj, key);
    if (v.is_null()) return 0;
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20))
      fail(field + "." + key, concat("must be a count (0..", 1 << 20, "), not ", show(v)));
    return static_cast<size_t>(v.get<int64_t>());
  }

  void decoders(const json& j, const std::string& field, std::vector<DecoderStep>& out) const {
    if (j.is_null()) return;
    const std::string t = type(j, field);
    DecoderStep d;
    if (t == "ByteLevel") {
      d.kind = DecoderStep::Kind::ByteLevel;
    } else if (t == "ByteFallback") {
      d.kind = DecoderStep::Kind::ByteFallback;
    } else if (t == "Fuse") {
      d.kind = DecoderStep::Kind::Fuse;
    } else if (t == "Replace") {
      d.kind = DecoderStep::Kind::Replace;
      d.pattern = pattern(j, field);
      d.content = text(member(j, "content"), field + ".content");
    } else if (t == "Strip") {
      d.kind = DecoderStep::Kind::Strip;
      d.content = text(member(j, "content"), field + ".content");
      if (utf8_char_count(d.content) != 1)
        fail(field + ".content", concat("must be one character, not ", show(member(j, "content"))));
      d.start = count(j, "start", field);
      d.stop = count(j, "stop", field);
    } else if (t == "Metaspace") {
      d.kind = DecoderStep::Kind::Metaspace;
      d.content = "\xE2\x96\x81";
      const json& r = member(j, "replacement");
      if (!r.is_null()) d.content = text(r, field + ".replacement");
      if (utf8_char_count(d.content) != 1)
        fail(field + ".replacement", concat("must be one character, not ", show(r)));
      const json& ps = member(j, "prepend_scheme");
      if (!ps.is_null())
        d.prepend_first = text(ps, field + ".prepend_scheme") != "never";
      else
        d.prepend_first = flag(j, "add_prefix_space", field, true);
    } else if (t == "Sequence") {
      const json& list = member(j, "decoders");
      if (!list.is_array()) fail(field + ".decoders", "must be an array");
      for (size_t i = 0; i < list.size(); ++i)
        decoders(list[i], concat(field, ".decoders[", i, "]"), out);
      return;
    } else {
      unsupported_type(
          field, t, "ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence (or null)");
    }
    out.push_back(std::move(d));
  }

  std::string origin_;
  Loaded* loaded_ = nullptr;
};

}  // namespace
}  // namespace tok

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& text,
                                                const std::string& origin) {
  tok::Loaded loaded;
  tok::Sax sax(loaded, origin);
  try {
    nlohmann::json::sax_parse(text, &sax);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(concat(origin, ": not valid JSON (", e.what(), ")"));
  }
  return std::make_unique<tok::HfTokenizer>(tok::Parser(origin).parse(loaded));
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  return from_json(read_text_file(path, kMaxTokenizerBytes, "tokenizer file"), path);
}

}  // namespace actcap
