#include "tokenizer/normalizer.h"

#include <algorithm>

#include "tokenizer/alignment.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace actcap::tok {

std::string Pattern::replace_all(std::string_view text, std::string_view content,
                                 size_t* head) const {
  std::string out;
  size_t prev = 0;
  const size_t in_head = head ? *head : 0;
  size_t out_head = 0;
  auto on_match = [&](size_t b, size_t e) {
    if (e == b) return;  // an empty match replaces nothing
    out.append(text.substr(prev, b - prev));
    out_head += sub_head(in_head, prev, b - prev);
    out.append(content);
    if (e <= in_head) out_head += content.size();
    prev = e;
  };
  if (regex) {
    regex->for_each_match(text, on_match);
  } else if (literal && !literal->empty()) {
    for (size_t at = text.find(*literal); at != std::string_view::npos;
         at = text.find(*literal, at + literal->size()))
      on_match(at, at + literal->size());
  }
  if (prev == 0) return std::string(text);
  out.append(text.substr(prev));
  if (head) *head = out_head + sub_head(in_head, prev, text.size() - prev);
  return out;
}

std::string Normalizer::apply(std::string_view text, size_t* head) const {
  // The head moves as Rust's alignments do: a character made from others aligns with the first
  // of them, an inserted one with the one before it.
  switch (kind) {
    case Kind::Unicode: {
      std::string out = normalize(form, text);
      if (head) *head = std::min(normalized_head(form, text, *head), out.size());
      return out;
    }
    case Kind::Prepend:
      // as in Rust: an empty text stays empty; the prefix aligns with the first character
      if (head && *head > 0) *head += content.size();
      return text.empty() ? std::string() : content + std::string(text);
    case Kind::Replace:
      return pattern.replace_all(text, content, head);
    case Kind::Lowercase:
      // character by character, so the head's characters lowered are the result's head
      if (head) *head = lowercase(text.substr(0, *head)).size();
      return lowercase(text);
    case Kind::Strip: {
      size_t b = 0, e = text.size(), len = 0;
      if (strip_left)
        while (b < e && is_white_space(utf8_decode(text, b, &len))) b += len;
      if (strip_right)
        while (e > b && is_white_space(utf8_decode_before(text, e, &len))) e -= len;
      if (head) *head = sub_head(*head, b, e - b);
      return std::string(text.substr(b, e - b));
    }
  }
  return std::string(text);
}

namespace {

// "<0xXX>" -> the byte, or -1.
int fallback_byte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    size_t len = 0;
    bool valid = true;
    for (size_t i = 0; i < bytes.size() && valid; i += len)
      valid = utf8_decode(bytes, i, &len) >= 0;
    if (valid) {
      out.push_back(bytes);
    } else {  // as in Rust: one U+FFFD per byte
      for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
    }
    bytes.clear();
  };
  for (std::string& t : tokens) {
    const int b = fallback_byte(t);
    if (b >= 0) {
      bytes += static_cast<char>(b);
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  return out;
}

std::string strip_token(const std::string& t, const std::string& ch, size_t start, size_t stop) {
  if (ch.empty()) return t;
  size_t b = 0, e = t.size();
  for (size_t k = 0; k < start && b + ch.size() <= e && t.compare(b, ch.size(), ch) == 0; ++k)
    b += ch.size();
  for (size_t k = 0; k < stop && e >= b + ch.size() && t.compare(e - ch.size(), ch.size(), ch) == 0;
       ++k)
    e -= ch.size();
  return t.substr(b, e - b);
}

}  // namespace

std::string run_decoders(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens) {
  if (steps.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::Kind::ByteLevel: {
        // As in Rust: a token with a character outside the byte alphabet is taken as its UTF-8
        // bytes. The bytes are kept as they are (Rust reads them as lossy UTF-8), so that any
        // encoded bytes decode back exactly.
        std::string bytes;
        for (const std::string& t : tokens)
          if (!byte_level_decode(bytes, t)) bytes += t;
        tokens.assign(1, std::move(bytes));
        break;
      }
      case DecoderStep::Kind::Replace:
        for (std::string& t : tokens) t = step.pattern.replace_all(t, step.content);
        break;
      case DecoderStep::Kind::ByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case DecoderStep::Kind::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecoderStep::Kind::Strip:
        for (std::string& t : tokens) t = strip_token(t, step.content, step.start, step.stop);
        break;
      case DecoderStep::Kind::Metaspace:
        // As in Rust: every replacement character of the first token is dropped (unless the
        // prepend scheme is "never"), the others become spaces.
        for (size_t i = 0; i < tokens.size(); ++i) {
          const bool drop = i == 0 && step.prepend_first;
          Pattern p;
          p.literal = step.content;
          tokens[i] = p.replace_all(tokens[i], drop ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace actcap::tok
