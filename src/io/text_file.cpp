#include "io/text_file.h"

#include <fstream>

#include "actcap/error.h"

namespace actcap {

std::string read_text_file(const std::string& path, uint64_t limit, const char* what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InputError(concat(path, ": cannot read ", what));
  const std::streamoff size = in.tellg();
  if (size < 0) throw InputError(concat(path, ": cannot read ", what, " (not a regular file?)"));
  if (static_cast<uint64_t>(size) > limit)
    throw InputError(concat(path, ": ", what, " is ", size, " bytes, over the limit of ", limit,
                            " bytes; is this the right file?"));
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (size > 0) in.read(text.data(), size);
  if (!in) throw InputError(concat(path, ": cannot read ", what));
  return text;
}

bool read_line_bounded(std::istream& in, std::string& line, uint64_t limit,
                       const std::string& origin, int64_t line_number) {
  line.clear();
  std::streambuf* sb = in.rdbuf();
  bool any = false;
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return any;
    }
    any = true;
    if (c == '\n') return true;
    if (line.size() >= limit)
      throw InputError(concat(origin, ":", line_number, ": line is longer than ", limit,
                              " bytes; split the document (one document per line)"));
    line.push_back(static_cast<char>(c));
  }
}

}  // namespace actcap
