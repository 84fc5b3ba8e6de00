#include "actcap/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "actcap/error.h"
#include "io/atomic_file.h"

// The file format is little-endian and tensors are handed out as views of the raw bytes.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "actcap assumes a little-endian host");

namespace actcap {
namespace {

using nlohmann::json;

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};

// Names this build can load. The order is also the order in which they are listed in errors.
const std::vector<DtypeName>& supported_dtypes() {
  static const std::vector<DtypeName> kTable = {
    {"BOOL", c10::ScalarType::Bool},
    {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},
    {"I16", c10::ScalarType::Short},
    {"I32", c10::ScalarType::Int},
    {"I64", c10::ScalarType::Long},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},
    // LibTorch has had complex64 since long before 1.13, so C64 loads everywhere.
    {"C64", c10::ScalarType::ComplexFloat},
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    {"F8_E5M2", c10::ScalarType::Float8_e5m2},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
#else
    // No 8-bit float types before LibTorch 2.1: their codes load as bytes, which only the FP8
    // decoding (models/fp8_weights.h, by TensorInfo::dtype_name) reads as values.
    {"F8_E5M2", c10::ScalarType::Byte},
    {"F8_E4M3", c10::ScalarType::Byte},
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    {"U16", c10::ScalarType::UInt16},
    {"U32", c10::ScalarType::UInt32},
    {"U64", c10::ScalarType::UInt64},
#endif
  };
  return kTable;
}

// Every dtype name in the safetensors specification, so that a valid file using a type this
// LibTorch lacks gets a different message from a corrupt one.
const std::vector<std::string>& spec_dtype_names() {
  static const std::vector<std::string> kNames = {
      "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
      "U16",  "F16", "BF16",    "I32",     "U32", "F32", "C64",     "F64",     "I64",     "U64"};
  return kNames;
}

std::string known_dtype_list() {
  std::string out;
  for (const auto& d : supported_dtypes()) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

// `where` prefixes the message: the file, and the tensor when there is one.
c10::ScalarType lookup_dtype(const std::string& name, const std::string& where) {
  for (const auto& d : supported_dtypes()) {
    if (name == d.name) return d.type;
  }
  const auto& spec = spec_dtype_names();
  if (std::find(spec.begin(), spec.end(), name) != spec.end()) {
    throw InputError(concat(where, ": dtype ", name,
                            " is valid safetensors but not supported by this build (LibTorch ",
                            TORCH_VERSION, "); supported: ", known_dtype_list()));
  }
  throw InputError(
      concat(where, ": unknown dtype '", name, "'; known dtypes: ", known_dtype_list()));
}

// Empty string when safetensors has no name for the type.
std::string dtype_name_or_empty(c10::ScalarType t) {
  for (const auto& d : supported_dtypes()) {
    if (t == d.type) return d.name;
  }
  return "";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::string offsets_str(uint64_t begin, uint64_t end) { return concat("[", begin, ", ", end, "]"); }

// A short rendering of a JSON value for "found ..." parts of messages; long values are cut.
std::string found(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return concat(v.type_name(), " ", s);
}

std::string describe_byte(uint8_t b) {
  if (b >= 0x20 && b < 0x7f) return concat("'", static_cast<char>(b), "'");
  static const char* kHex = "0123456789abcdef";
  return concat("byte 0x", kHex[b >> 4], kHex[b & 15]);
}

// Parses JSON text while rejecting duplicate keys, which nlohmann would otherwise resolve
// silently by keeping the last one: a duplicated tensor name must not hide a tensor.
json parse_json_strict(const char* begin, const char* end, const std::string& origin) {
  std::vector<std::set<std::string>> open_objects;
  std::string top_key;    // the most recent key of the outermost object (the tensor name)
  std::string duplicate;  // message for the first duplicate found
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (open_objects.size() == 1) top_key = k;
        if (!open_objects.empty() && !open_objects.back().insert(k).second && duplicate.empty()) {
          duplicate =
              open_objects.size() == 1
                  ? concat("name '", k, "' appears more than once in the header")
                  : concat("key '", k, "' appears more than once in the entry for '", top_key, "'");
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(begin, end, callback);
  } catch (const json::exception& e) {
    // The parser quotes what it last read, which may be any bytes: keep the message printable.
    std::string what;
    for (const unsigned char c : std::string(e.what())) {
      if (c >= 0x20 && c < 0x7f) {
        what += static_cast<char>(c);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "\\x%02x", c);
        what += hex;
      }
    }
    throw InputError(concat(origin, ": header is not valid JSON: ", what));
  }
  if (!duplicate.empty()) throw InputError(concat(origin, ": ", duplicate));
  return j;
}

void parse_metadata(const json& v, const std::string& origin, SafetensorsHeader& out) {
  // The reference implementation models __metadata__ as an optional map, so null means absent.
  if (v.is_null()) return;
  if (!v.is_object()) {
    throw InputError(
        concat(origin, ": __metadata__ must be an object of string to string, found ", found(v)));
  }
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      throw InputError(concat(origin, ": __metadata__ value for key '", key,
                              "' must be a string, found ", found(value)));
    }
    out.metadata[key] = value.get<std::string>();
  }
}

TensorInfo parse_entry(const std::string& name, const json& v, uint64_t data_size,
                       const std::string& origin) {
  const std::string where = concat(origin, ": tensor '", name, "'");
  if (!v.is_object()) {
    throw InputError(concat(
        where, ": entry must be an object with dtype, shape and data_offsets, found ", found(v)));
  }
  for (const auto& [key, value] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw InputError(concat(where, ": unexpected key '", key,
                              "' (expected exactly dtype, shape and data_offsets)"));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) throw InputError(concat(where, ": missing key '", key, "'"));
  }

  TensorInfo info;
  info.name = name;

  const json& dtype = v["dtype"];
  if (!dtype.is_string()) {
    throw InputError(concat(where, ": \"dtype\" must be a string, found ", found(dtype)));
  }
  info.dtype_name = dtype.get<std::string>();
  info.dtype = lookup_dtype(info.dtype_name, where);

  const json& shape = v["shape"];
  if (!shape.is_array()) {
    throw InputError(
        concat(where, ": \"shape\" must be an array of integers, found ", found(shape)));
  }
  for (const json& d : shape) {
    if (!d.is_number_integer()) {
      throw InputError(
          concat(where, ": \"shape\" must be an array of integers, found element ", found(d)));
    }
    if (d.is_number_unsigned() &&
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw InputError(concat(where, ": dimension ", d.get<uint64_t>(), " in shape is too large"));
    }
    info.shape.push_back(d.get<int64_t>());
  }
  for (int64_t d : info.shape) {
    if (d < 0) {
      throw InputError(
          concat(where, ": negative dimension ", d, " in shape ", shape_str(info.shape)));
    }
  }

  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw InputError(concat(where, ": \"data_offsets\" must be [BEGIN, END] with non-negative ",
                            "integers, found ", found(offsets)));
  }
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  if (info.begin > info.end) {
    throw InputError(concat(where, ": data_offsets ", offsets_str(info.begin, info.end),
                            " has BEGIN greater than END"));
  }

  const uint64_t itemsize = c10::elementSize(info.dtype);
  uint64_t nbytes = itemsize;
  bool overflow = false;
  for (int64_t d : info.shape) {
    if (d != 0)
      overflow = overflow || __builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes);
  }
  // A zero dimension makes the tensor empty, but the other dimensions must still multiply to a
  // representable size (numel() and LibTorch's empty() compute the full product).
  overflow = overflow || nbytes > static_cast<uint64_t>(INT64_MAX);
  if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) nbytes = 0;
  const std::string layout =
      concat("shape ", shape_str(info.shape), " x ", info.dtype_name, " (", itemsize, " bytes)");
  if (overflow) throw InputError(concat(where, ": ", layout, " overflows a 64-bit byte count"));
  if (nbytes != info.end - info.begin) {
    throw InputError(concat(where, ": ", layout, " = ", nbytes, " bytes but data_offsets ",
                            offsets_str(info.begin, info.end), " span ", info.end - info.begin));
  }
  if (info.end > data_size) {
    throw InputError(concat(where, ": data_offsets ", offsets_str(info.begin, info.end),
                            " end beyond the data section of ", data_size, " bytes"));
  }
  return info;
}

std::string errno_str(int e) { return std::strerror(e); }

at::Tensor cpu_contiguous(const at::Tensor& t) {
  at::Tensor c = t.device().is_cpu() ? t : t.cpu();
  // Lazy conjugate/negative views keep the unmodified bytes in memory; materialise them.
  return c.resolve_conj().resolve_neg().contiguous();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

c10::ScalarType safetensors_dtype(const std::string& name, const std::string& origin) {
  return lookup_dtype(name, origin);
}

std::string safetensors_dtype_name(c10::ScalarType t) {
  std::string name = dtype_name_or_empty(t);
  if (name.empty()) {
    throw InputError(concat("dtype ", c10::toString(t),
                            " cannot be stored in safetensors by actcap; ",
                            "supported: ", known_dtype_list()));
  }
  return name;
}

SafetensorsHeader parse_safetensors(const uint8_t* data, uint64_t size, const std::string& origin) {
  if (size < 8) {
    throw InputError(concat(origin, ": truncated safetensors file: ", size,
                            " bytes, but the header length alone takes 8"));
  }
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > kMaxSafetensorsHeader) {
    throw InputError(concat(origin, ": header length ", n, " exceeds the limit of ",
                            kMaxSafetensorsHeader, " bytes"));
  }
  if (n > size - 8) {
    throw InputError(concat(origin, ": header length ", n, " exceeds file size ", size,
                            " (truncated or not a safetensors file)"));
  }
  if (n == 0) throw InputError(concat(origin, ": header is empty; expected a JSON object"));
  if (data[8] != '{') {
    throw InputError(concat(origin, ": header must be a JSON object starting with '{', found ",
                            describe_byte(data[8])));
  }

  const char* text = reinterpret_cast<const char*>(data + 8);
  const json j = parse_json_strict(text, text + n, origin);
  if (!j.is_object()) {
    throw InputError(concat(origin, ": header must be a JSON object, found ", j.type_name()));
  }

  SafetensorsHeader header;
  header.data_offset = 8 + n;
  const uint64_t data_size = size - header.data_offset;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      parse_metadata(value, origin, header);
    } else {
      header.tensors.push_back(parse_entry(name, value, data_size, origin));
    }
  }

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  // Tensors must tile the data section exactly: no byte shared, no byte unaccounted for.
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin < pos) {
      throw InputError(concat(origin, ": tensor '", t.name, "' data_offsets ",
                              offsets_str(t.begin, t.end), " overlaps tensor '", prev->name, "' ",
                              offsets_str(prev->begin, prev->end)));
    }
    if (t.begin > pos) {
      throw InputError(concat(origin, ": bytes [", pos, ", ", t.begin,
                              ") of the data section are not covered by any tensor (hole before "
                              "tensor '",
                              t.name, "'; expected its data_offsets to begin at ", pos, ")"));
    }
    pos = t.end;
    prev = &t;
  }
  if (pos != data_size) {
    throw InputError(concat(origin, ": ", data_size - pos,
                            " bytes of the data section are not covered (", "tensors end at ", pos,
                            " but the data section is ", data_size, " bytes)"));
  }
  return header;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(concat("cannot open ", path, ": ", errno_str(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw InputError(concat("cannot stat ", path, ": ", errno_str(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(concat(path, " is not a regular file"));
  }
  // The constructor is private, so make_shared cannot be used.
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      f->size_ = 0;
      throw InputError(concat("cannot map ", path, ": ", errno_str(e)));
    }
    f->base_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  f->header_ = parse_safetensors(f->base_, f->size_, path);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) {
    f->index_[f->header_.tensors[i].name] = i;
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name, size_t alignment) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) throw InputError(concat(path_, ": no tensor named '", name, "'"));
  const auto options = at::TensorOptions().dtype(info->dtype).device(at::kCPU);
  if (info->end == info->begin) return at::empty(info->shape, options);
  const uint8_t* p = data(*info);
  const size_t itemsize = c10::elementSize(info->dtype);
  const size_t n = info->end - info->begin;
  if (reinterpret_cast<uintptr_t>(p) % std::max(itemsize, alignment) == 0) {
    // The tensor owns a reference to this file, so the mapping outlives every view of it.
    std::shared_ptr<const SafetensorsFile> keep = shared_from_this();
    return at::from_blob(
        const_cast<uint8_t*>(p), info->shape, [keep](void*) {}, options);
  }
  // Files written by other tools need not align the data section (misaligned loads of multi-byte
  // types are undefined behaviour, and GEMMs are slower off their alignment), so copy.
  at::Tensor out = at::empty(info->shape, options);
  std::memcpy(out.data_ptr(), p, n);
  // The pages wholly inside this tensor were read once and are not needed again: drop them from
  // this process's mapping so they are not resident twice (a later touch faults them back in
  // from the file; the mapping is private and never written).
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  return out;
}

std::string safetensors_header_json(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  // "format": "pt" is what the Python loaders key on, so it is never overridden.
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "pt";
  nlohmann::ordered_json meta_json = nlohmann::ordered_json::object();
  for (const auto& [key, value] : meta) meta_json[key] = value;
  header["__metadata__"] = std::move(meta_json);

  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") {
      throw InputError("tensor name '__metadata__' is reserved by the safetensors format");
    }
    if (!seen.insert(name).second) throw InputError(concat("duplicate tensor name '", name, "'"));
    if (!t.defined()) throw InputError(concat("tensor '", name, "' is undefined"));
    const std::string dtype = dtype_name_or_empty(t.scalar_type());
    if (dtype.empty()) {
      throw InputError(concat("tensor '", name, "' has dtype ", c10::toString(t.scalar_type()),
                              ", which safetensors cannot store; supported: ", known_dtype_list()));
    }
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype;
    entry["shape"] = t.sizes().vec();
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + nbytes});
    header[name] = std::move(entry);
    offset += nbytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(concat("tensor names and metadata must be valid UTF-8: ", e.what()));
  }
  // Padding to 8 keeps the data section aligned for every dtype, which makes loads zero-copy.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  if (text.size() > kMaxSafetensorsHeader) {
    throw InputError(concat("safetensors header would be ", text.size(),
                            " bytes, over the limit of ", kMaxSafetensorsHeader));
  }
  return text;
}

std::string safetensors_prefix(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header_json(tensors, metadata);
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header;
}

void write_safetensors_data(int fd, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const std::string& path) {
  for (const auto& [name, t] : tensors) {
    // One tensor at a time, so at most one extra CPU copy is alive.
    const at::Tensor c = cpu_contiguous(t);
    const size_t nbytes = static_cast<size_t>(c.numel()) * c.element_size();
    if (nbytes > 0) write_all(fd, c.data_ptr(), nbytes, path);
  }
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string prefix;
  try {
    prefix = safetensors_prefix(tensors, metadata);
  } catch (const InputError& e) {
    throw InputError(concat("cannot write ", path, ": ", e.what()));
  }
  write_file_atomic(path, [&](int fd) {
    write_all(fd, prefix.data(), prefix.size(), path);
    write_safetensors_data(fd, tensors, path);
  });
}

}  // namespace actcap
