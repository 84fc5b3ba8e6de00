// Encodes the input bytes (as text, any bytes) with fixed tokenizers built once:
//   gpt2   GPT-2-like byte-level BPE: ByteLevel pre-tokenizer (GPT-2 regex), a few merges,
//          <|endoftext|> special token, ByteLevel post-processor and decoder;
//   llama3 Llama-3-like: Sequence[Split(Llama 3 regex, Isolated), ByteLevel(use_regex=false)],
//          ignore_merges, TemplateProcessing adding <|begin_of_text|>;
//   misc   not byte-level: NFKC normalizer, Digits/Split pre-tokenizers, unk + fuse_unk +
//          byte_fallback, lstrip/rstrip/single_word/normalized added tokens, BertProcessing;
//   llama2 SentencePiece-style as Llama 2 ships it: normalizers Prepend("\u2581") +
//          Replace(" " -> "\u2581"), no pre-tokenizer, byte_fallback over all 256 bytes,
//          TemplateProcessing <s>, decoders Replace + ByteFallback + Fuse + Strip(" ", 1, 0);
//   metaspace  as Mistral v0.3 ships it: Metaspace pre-tokenizer (prepend_scheme first, no
//          split), ignore_merges + byte_fallback, TemplateProcessing <s> ... </s>, decoders
//          ByteFallback + Metaspace(first);
//   strip  normalizers Strip + Lowercase + Replace(regex) before Metaspace (always, split),
//          TemplateProcessing <s> ... </s>, decoders ByteFallback, Metaspace, Fuse, Strip,
//          ByteLevel in one Sequence.
// Invariants (asserted):
//   * gpt2 and llama3 are byte-level without a normalizer: decode(encode(x)) == x for all bytes x;
//   * llama2 and metaspace are lossless on valid UTF-8 without U+2581 and added-token text (and,
//     for metaspace, not starting with a space): decode(encode(x)) == x;
//   * gpt2's ByteLevel post-processor adds nothing; llama3's adds exactly <|begin_of_text|> first,
//     llama2's <s> first, metaspace's and strip's <s> first and </s> last;
//   * strip: whitespace around the text changes no id (Strip is its first normalizer);
//   * encode is deterministic (the second call is served by the BPE cache);
//   * Bpe::merge (quadratic scan) == Bpe::merge_with_queue on the same symbols.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actcap/tokenizer.h"
#include "fuzz_common.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using json = nlohmann::json;

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string spell(const std::string& raw) {
  std::string out;
  actcap::tok::byte_level_append(out, raw);
  return out;
}

// Raw-byte merges (spelled through the byte alphabet for byte-level vocabularies). Chosen to
// overlap (a a / aa a / a aa / aa aa) so that merge order and ties matter.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"},  {" ", "t"},   {" t", "he"},  {"i", "n"},    {"e", "r"},       {"a", "n"},
    {" ", "a"},  {"o", "n"},   {"r", "e"},    {" ", "s"},    {"in", "g"},      {"a", "a"},
    {"aa", "a"}, {"a", "aa"},  {"aa", "aa"},  {"aaa", "aa"}, {"\xc3", "\xa9"}, {" ", "\xe6"},
    {"1", "2"},  {"12", "3"},  {"'", "s"},    {"\n", "\n"},  {" ", " "},       {"  ", "  "},
    {"l", "l"},  {"he", "ll"}, {"hell", "o"}, {" w", "or"},  {" ", "w"},       {"o", "r"},
    {"b", "b"},  {"bb", "b"},  {"b", "bb"},   {"ab", "ba"},  {"a", "b"},       {"b", "a"},
};

json byte_level_vocab_and_merges(json& merges) {
  json vocab = json::object();
  int64_t next = 0;
  for (int b = 0; b < 256; ++b) vocab[actcap::tok::byte_alphabet().byte_to_char[b]] = next++;
  merges = json::array();
  for (const auto& [a, b] : kMerges) {
    merges.push_back(spell(a) + " " + spell(b));
    const std::string joined = spell(a + b);
    if (!vocab.contains(joined)) vocab[joined] = next++;
  }
  return vocab;
}

json added(int64_t id, const std::string& content, bool special, json extra = json::object()) {
  json t = {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
            {"rstrip", false}, {"normalized", !special}, {"special", special}};
  for (auto& [k, v] : extra.items()) t[k] = v;
  return t;
}

json bpe_model(json vocab, json merges, bool ignore_merges, json unk = nullptr,
               bool fuse_unk = false, bool byte_fallback = false) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", unk},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", fuse_unk},
          {"byte_fallback", byte_fallback},
          {"ignore_merges", ignore_merges},
          {"vocab", vocab},
          {"merges", merges}};
}

constexpr int64_t kEndOfText = 1000, kBeginOfText = 1001, kEndOfTextL3 = 1002;

std::unique_ptr<actcap::Tokenizer> build_gpt2() {
  json merges;
  json vocab = byte_level_vocab_and_merges(merges);
  json doc = {{"version", "1.0"},
              {"added_tokens", {added(kEndOfText, "<|endoftext|>", true)}},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "ByteLevel"},
                {"add_prefix_space", false},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"post_processor",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", false},
                {"use_regex", true}}},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model", bpe_model(vocab, merges, false)}};
  return actcap::Tokenizer::from_json(doc.dump(), "gpt2-like tokenizer.json");
}

std::unique_ptr<actcap::Tokenizer> build_llama3() {
  json merges;
  json vocab = byte_level_vocab_and_merges(merges);
  json doc = {{"version", "1.0"},
              {"added_tokens",
               {added(kBeginOfText, "<|begin_of_text|>", true),
                added(kEndOfTextL3, "<|end_of_text|>", true)}},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", kLlama3Pattern}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}}}}}},
              {"post_processor",
               {{"type", "Sequence"},
                {"processors",
                 {{{"type", "ByteLevel"},
                   {"add_prefix_space", true},
                   {"trim_offsets", false},
                   {"use_regex", true}},
                  {{"type", "TemplateProcessing"},
                   {"single",
                    {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                   {"pair", json::array()},
                   {"special_tokens",
                    {{"<|begin_of_text|>",
                      {{"id", "<|begin_of_text|>"},
                       {"ids", {kBeginOfText}},
                       {"tokens", {"<|begin_of_text|>"}}}}}}}}}}},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model", bpe_model(vocab, merges, true)}};
  return actcap::Tokenizer::from_json(doc.dump(), "llama3-like tokenizer.json");
}

std::unique_ptr<actcap::Tokenizer> build_misc() {
  json vocab = json::object();
  int64_t next = 0;
  vocab["<unk>"] = next++;
  for (int b = 0; b < 256; b += 3) {  // byte fallback for a third of the bytes only
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = next++;
  }
  for (const char* ch : {"a",  "b", "e", "h", "i", "l", "n", "o",        "r",
                         "s",  "t", "w", " ", "1", "2", "3", "\xc3\xa9", "\xe6\x97\xa5",
                         "fi", "."})
    vocab[ch] = next++;
  json merges = json::array();
  for (const auto& [a, b] : kMerges) {
    if (!vocab.contains(a) || !vocab.contains(b)) continue;
    merges.push_back(json::array({a, b}));  // the [a, b] form of merges
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  json doc = {{"version", "1.0"},
              {"added_tokens",
               {added(500, "[CLS]", true), added(501, "[SEP]", true),
                added(502, "<mask>", true, {{"lstrip", true}, {"rstrip", true}}),
                added(503, "hello", false, {{"single_word", true}}),
                added(504, "\xef\xac\x81x", false, {{"normalized", true}}),  // ﬁx, NFKC -> fix
                added(505, "ab", false, {{"normalized", false}, {"rstrip", true}})}},
              {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}}},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Digits"}, {"individual_digits", true}},
                  {{"type", "Split"},
                   {"pattern", {{"String", " "}}},
                   {"behavior", "MergedWithNext"},
                   {"invert", false}},
                  {{"type", "Split"},
                   {"pattern", {{"Regex", "\\p{P}+"}}},
                   {"behavior", "Contiguous"},
                   {"invert", true}},
                  {{"type", "Split"},
                   {"pattern", {{"Regex", "\\s*\\w+"}}},
                   {"behavior", "MergedWithPrevious"},
                   {"invert", false}}}}}},
              {"post_processor",
               {{"type", "BertProcessing"}, {"cls", {"[CLS]", 500}}, {"sep", {"[SEP]", 501}}}},
              {"decoder", nullptr},
              {"model", bpe_model(vocab, merges, false, "<unk>", true, true)}};
  return actcap::Tokenizer::from_json(doc.dump(), "misc tokenizer.json");
}

// ---- SentencePiece-style tokenizers (Llama 2, Mistral v0.3) -----------------------------------

const char* kMeta = "\xe2\x96\x81";  // U+2581, SentencePiece's space
constexpr int64_t kUnk = 0, kBos = 1, kEos = 2;

// <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, a few characters and merges over them
// (spaces spelled as U+2581), in the [a, b] form of merges.
json sentencepiece_vocab_and_merges(json& merges) {
  json vocab = {{"<unk>", kUnk}, {"<s>", kBos}, {"</s>", kEos}};
  int64_t next = 3;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = next++;
  }
  for (const char* ch : {kMeta, "a", "b", "e", "g", "h", "i", "l", "n", "o", "r", "s", "t", "w",
                         "1", "2", "\xc3\xa9", "\xe6\x97\xa5"})
    vocab[ch] = next++;
  const std::string m = kMeta;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {m, "t"},       {"h", "e"},      {m + "t", "he"}, {"i", "n"},    {"in", "g"},
      {m, "a"},       {"a", "a"},      {"aa", "a"},     {"a", "aa"},   {m, m},
      {m + m, m + m}, {"l", "l"},      {"he", "ll"},    {"hell", "o"}, {m, "w"},
      {"o", "r"},     {m + "w", "or"}, {"1", "2"},      {"e", "r"},    {m, "\xe6\x97\xa5"}};
  merges = json::array();
  for (const auto& [a, b] : pairs) {
    merges.push_back(json::array({a, b}));
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  return vocab;
}

json sentencepiece_added() {
  return {added(kUnk, "<unk>", true), added(kBos, "<s>", true), added(kEos, "</s>", true)};
}

json special_item(const char* token) { return {{"SpecialToken", {{"id", token}, {"type_id", 0}}}}; }

json template_processing(bool eos) {
  json single = {special_item("<s>"), {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}};
  if (eos) single.push_back(special_item("</s>"));
  json specials = {{"<s>", {{"id", "<s>"}, {"ids", {kBos}}, {"tokens", {"<s>"}}}}};
  if (eos) specials["</s>"] = {{"id", "</s>"}, {"ids", {kEos}}, {"tokens", {"</s>"}}};
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", json::array()},
          {"special_tokens", specials}};
}

json metaspace(const char* scheme, bool split) {
  return {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}, {"split", split}};
}

// A tokenizer.json over sentencepiece_vocab_and_merges() (byte_fallback, unk, fuse_unk) with its
// added tokens, the given normalizer, pre-tokenizer and decoders (in a Sequence), and
// TemplateProcessing <s> (... </s>).
std::unique_ptr<actcap::Tokenizer> build_sentencepiece(json normalizer, json pre_tokenizer,
                                                       json decoders, bool eos, bool ignore_merges,
                                                       const char* origin) {
  json merges;
  json vocab = sentencepiece_vocab_and_merges(merges);
  json doc = {{"version", "1.0"},
              {"added_tokens", sentencepiece_added()},
              {"normalizer", normalizer},
              {"pre_tokenizer", pre_tokenizer},
              {"post_processor", template_processing(eos)},
              {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
              {"model", bpe_model(vocab, merges, ignore_merges, "<unk>", true, true)}};
  return actcap::Tokenizer::from_json(doc.dump(), origin);
}

std::unique_ptr<actcap::Tokenizer> build_llama2() {
  return build_sentencepiece(
      {{"type", "Sequence"},
       {"normalizers",
        {{{"type", "Prepend"}, {"prepend", kMeta}},
         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}}}},
      nullptr,
      {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
       {{"type", "ByteFallback"}},
       {{"type", "Fuse"}},
       {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}},
      false, false, "llama2-like tokenizer.json");
}

std::unique_ptr<actcap::Tokenizer> build_metaspace() {
  return build_sentencepiece(nullptr, metaspace("first", false),
                             {{{"type", "ByteFallback"}}, metaspace("first", false)}, true, true,
                             "metaspace tokenizer.json");
}

std::unique_ptr<actcap::Tokenizer> build_strip() {
  return build_sentencepiece(
      {{"type", "Sequence"},
       {"normalizers",
        {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
         {{"type", "Lowercase"}},
         {{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "12"}}}}},
      metaspace("always", true),
      {{{"type", "ByteFallback"}},
       metaspace("always", true),
       {{"type", "Fuse"}},
       {{"type", "Strip"}, {"content", " "}, {"start", 0}, {"stop", 1}},
       {{"type", "ByteLevel"}}},
      true, false, "strip tokenizer.json");
}

struct Tokenizers {
  std::unique_ptr<actcap::Tokenizer> gpt2 = build_gpt2();
  std::unique_ptr<actcap::Tokenizer> llama3 = build_llama3();
  std::unique_ptr<actcap::Tokenizer> misc = build_misc();
  std::unique_ptr<actcap::Tokenizer> llama2 = build_llama2();
  std::unique_ptr<actcap::Tokenizer> metaspace = build_metaspace();
  std::unique_ptr<actcap::Tokenizer> strip = build_strip();
};

const Tokenizers& tokenizers() {
  static const Tokenizers t;
  return t;
}

std::vector<int64_t> encode(const actcap::Tokenizer& t, const std::string& s, bool special,
                            const char* which) {
  std::vector<int64_t> ids;
  std::string why;
  try {
    ids = t.encode(s, special);
  } catch (const actcap::Error& e) {
    why = e.what();
  }
  FUZZ_CHECK(why.empty(), "%s: encode('%s') threw: %s", which, fuzz::escape(s).c_str(),
             why.c_str());
  return ids;
}

void round_trip(const actcap::Tokenizer& t, const std::string& s, const char* which) {
  const std::vector<int64_t> ids = encode(t, s, false, which);
  FUZZ_CHECK(encode(t, s, false, which) == ids, "%s: encode('%s') is not deterministic", which,
             fuzz::escape(s).c_str());
  std::string back, why;
  try {
    back = t.decode(ids);
  } catch (const actcap::Error& e) {
    why = e.what();
  }
  FUZZ_CHECK(why.empty(), "%s: decode(encode('%s')) threw: %s", which, fuzz::escape(s).c_str(),
             why.c_str());
  FUZZ_CHECK(back == s, "%s: decode(encode(x)) != x\n  x    = '%s'\n  back = '%s'", which,
             fuzz::escape(s).c_str(), fuzz::escape(back).c_str());
}

// Whether x round-trips through the SentencePiece-style tokenizers: valid UTF-8, no U+2581 (it
// decodes as a space), no added token's text (the text around an added token is normalized on
// its own, so Prepend / Metaspace add a space there).
bool sentencepiece_lossless(const std::string& x) {
  for (size_t i = 0; i < x.size();) {
    size_t len;
    if (actcap::tok::utf8_decode(x, i, &len) < 0) return false;
    i += len;
  }
  for (const char* t : {kMeta, "<unk>", "<s>", "</s>"})
    if (x.find(t) != std::string::npos) return false;
  return true;
}

// add_special == [<s>] + ids (+ [</s>]).
void check_template(const actcap::Tokenizer& t, const std::string& s, bool eos, const char* which) {
  std::vector<int64_t> plain = encode(t, s, false, which);
  plain.insert(plain.begin(), kBos);
  if (eos) plain.push_back(kEos);
  FUZZ_CHECK(encode(t, s, true, which) == plain, "%s: add_special is not <s> + ids%s", which,
             eos ? " + </s>" : "");
}

void check_merge(const actcap::tok::Bpe& bpe, std::vector<int32_t> symbols) {
  if (symbols.size() > 48) symbols.resize(48);  // merge() scans up to 48 symbols itself
  std::vector<int32_t> scan = symbols, queue = symbols;
  bpe.merge(scan);
  bpe.merge_with_queue(queue);
  FUZZ_CHECK(scan == queue, "Bpe::merge and Bpe::merge_with_queue disagree on %zu symbols",
             symbols.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizers& t = tokenizers();
  const std::string text(reinterpret_cast<const char*>(data), size);

  // gpt2-like: exact round trip; the ByteLevel post-processor adds no ids.
  round_trip(*t.gpt2, text, "gpt2");
  FUZZ_CHECK(encode(*t.gpt2, text, true, "gpt2") == encode(*t.gpt2, text, false, "gpt2"),
             "gpt2: ByteLevel post-processor changed the ids");

  // llama3-like: exact round trip; add_special puts <|begin_of_text|> first.
  round_trip(*t.llama3, text, "llama3");
  {
    std::vector<int64_t> plain = encode(*t.llama3, text, false, "llama3");
    plain.insert(plain.begin(), kBeginOfText);
    FUZZ_CHECK(encode(*t.llama3, text, true, "llama3") == plain,
               "llama3: add_special is not [<|begin_of_text|>] + ids");
  }

  // misc: must not fail (unk is in the vocab), ids decode, deterministic.
  {
    const std::vector<int64_t> ids = encode(*t.misc, text, true, "misc");
    FUZZ_CHECK(ids.size() >= 2 && ids.front() == 500 && ids.back() == 501,
               "misc: BertProcessing template not applied");
    FUZZ_CHECK(encode(*t.misc, text, true, "misc") == ids, "misc: not deterministic");
    FUZZ_CHECK(fuzz::clean([&] { t.misc->decode(ids); }), "misc: decode(encode(x)) threw");
  }

  // SentencePiece-style: lossless where the format is, the templates, Strip first.
  if (sentencepiece_lossless(text)) {
    round_trip(*t.llama2, text, "llama2");
    if (text.empty() || text[0] != ' ') round_trip(*t.metaspace, text, "metaspace");
  }
  check_template(*t.llama2, text, false, "llama2");
  check_template(*t.metaspace, text, true, "metaspace");
  {
    const std::vector<int64_t> ids = encode(*t.strip, text, false, "strip");
    FUZZ_CHECK(encode(*t.strip, " \t" + text + "\n ", false, "strip") == ids,
               "strip: whitespace around '%s' changed the ids", fuzz::escape(text).c_str());
    check_template(*t.strip, text, true, "strip");
    FUZZ_CHECK(fuzz::clean([&] { t.strip->decode(ids); }), "strip: decode(encode(x)) threw");
  }

  // Both merge strategies on the input as byte symbols (id == byte in the byte-level vocab), and
  // folded onto the letters the merges use, so that merges actually fire.
  const auto& bpe = dynamic_cast<const actcap::tok::HfTokenizer&>(*t.gpt2).model();
  std::vector<int32_t> raw, folded;
  static const char kLetters[] = "aabbaab hell o1223 ";
  for (size_t i = 0; i < size; ++i) {
    raw.push_back(data[i]);
    folded.push_back(static_cast<unsigned char>(kLetters[data[i] % (sizeof kLetters - 1)]));
  }
  check_merge(bpe, raw);
  check_merge(bpe, folded);
  return 0;
}
