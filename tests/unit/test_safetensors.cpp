#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "actcap/error.h"
#include "actcap/safetensors.h"

namespace actcap {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "actcap-st-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename());
    return out;
  }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out;
}

// A safetensors image from a literal header and data section. The header is space-padded so
// that the data section is 8-aligned, as the writer does, unless `pad` is false.
std::string st_bytes(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

// Runs `f`, which must throw InputError, and returns the message.
std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InputError, nothing thrown";
  return "";
}

class SafetensorsMalformed : public ::testing::Test {
 protected:
  // Writes the bytes to a file named bad.safetensors and returns the message of opening it.
  std::string open_error(const std::string& bytes) {
    path_ = dir_.file("bad.safetensors");
    write_file(path_, bytes);
    return input_error([&] { SafetensorsFile::open(path_); });
  }
  TempDir dir_;
  std::string path_;
};

TEST_F(SafetensorsMalformed, EmptyFileIsTruncated) {
  const std::string msg = open_error("");
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("truncated"));
}

TEST_F(SafetensorsMalformed, ShorterThanLengthPrefix) {
  const std::string msg = open_error(std::string("\x10\0\0\0\0", 5));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("truncated"));
  EXPECT_THAT(msg, HasSubstr("5 bytes"));
}

TEST_F(SafetensorsMalformed, HeaderLengthOverLimit) {
  const std::string msg = open_error(le64(kMaxSafetensorsHeader + 1) + "{}");
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(kMaxSafetensorsHeader + 1)));
  EXPECT_THAT(msg, HasSubstr("limit"));
}

TEST_F(SafetensorsMalformed, HeaderLengthPastEndOfFile) {
  const std::string msg = open_error(le64(100) + "{}        ");
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("header length 100 exceeds file size 18"));
}

TEST_F(SafetensorsMalformed, HeaderNotStartingWithBrace) {
  EXPECT_THAT(open_error(st_bytes(" {}", "")), HasSubstr("starting with '{'"));
  const std::string msg = open_error(st_bytes("[1, 2]", ""));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("starting with '{', found '['"));
}

TEST_F(SafetensorsMalformed, HeaderNotJson) {
  const std::string msg = open_error(st_bytes("{\"a\": ", ""));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsMalformed, HeaderWithTrailingGarbage) {
  EXPECT_THAT(open_error(st_bytes("{} x", "")), HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsMalformed, HeaderNotUtf8) {
  EXPECT_THAT(open_error(st_bytes("{\"\xff\xfe\": {}}", "")), HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsMalformed, EntryNotObject) {
  const std::string msg = open_error(st_bytes(R"({"w": [1, 2]})", ""));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("must be an object"));
  EXPECT_THAT(msg, HasSubstr("found array"));
}

TEST_F(SafetensorsMalformed, EntryMissingKey) {
  const std::string msg = open_error(st_bytes(R"({"w": {"dtype": "F32", "shape": [1]}})", ""));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("missing key 'data_offsets'"));
}

TEST_F(SafetensorsMalformed, EntryExtraKey) {
  const std::string msg = open_error(
      st_bytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "stride": [1]}})",
               std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("unexpected key 'stride'"));
}

TEST_F(SafetensorsMalformed, DtypeNotString) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("\"dtype\" must be a string, found number 7"));
}

TEST_F(SafetensorsMalformed, ShapeNotArray) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})", std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("\"shape\" must be an array of integers, found string"));
}

TEST_F(SafetensorsMalformed, ShapeElementNotInteger) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("found element number 1.5"));
}

TEST_F(SafetensorsMalformed, OffsetsWrongLength) {
  const std::string msg = open_error(
      st_bytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", std::string(4, 0)));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("\"data_offsets\" must be [BEGIN, END]"));
  EXPECT_THAT(msg, HasSubstr("[0]"));
}

TEST_F(SafetensorsMalformed, OffsetsNegative) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("non-negative"));
  EXPECT_THAT(msg, HasSubstr("[-4,0]"));
}

TEST_F(SafetensorsMalformed, UnknownDtype) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("unknown dtype 'F33'"));
  // The known names are listed so the user can see what was expected.
  EXPECT_THAT(msg, HasSubstr("BF16"));
  EXPECT_THAT(msg, HasSubstr("F32"));
}

TEST_F(SafetensorsMalformed, SpecDtypeUnsupportedByBuild) {
#if TORCH_VERSION_MAJOR < 2
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "U16", "shape": [2], "data_offsets": [0, 4]}})", std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("dtype U16 is valid safetensors but not supported by this build"));
#endif
  const std::string f8 =
      open_error(st_bytes(R"({"w": {"dtype": "F8_E8M0", "shape": [4], "data_offsets": [0, 4]}})",
                          std::string(4, '\0')));
  EXPECT_THAT(f8, HasSubstr("dtype F8_E8M0 is valid safetensors but not supported by this build"));
}

TEST_F(SafetensorsMalformed, NegativeDimension) {
  const std::string msg = open_error(
      st_bytes(R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 0]}})", ""));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("negative dimension -1 in shape [-1, 2]"));
}

TEST_F(SafetensorsMalformed, ByteCountOverflow) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 0]}})", ""));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("overflows"));
}

TEST_F(SafetensorsMalformed, SizeMismatch) {
  const std::string msg =
      open_error(st_bytes(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
                          std::string(20, '\0')));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("shape [2, 3] x F32 (4 bytes) = 24 bytes but data_offsets [0, 20] "
                             "span 20"));
}

TEST_F(SafetensorsMalformed, BeginAfterEnd) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", std::string(8, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("data_offsets [8, 4] has BEGIN greater than END"));
}

TEST_F(SafetensorsMalformed, EndBeyondDataSection) {
  const std::string msg = open_error(st_bytes(
      R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("end beyond the data section of 4 bytes"));
}

TEST_F(SafetensorsMalformed, OverlappingRanges) {
  const std::string msg =
      open_error(st_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                          R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                          std::string(12, '\0')));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("tensor 'b' data_offsets [4, 12] overlaps tensor 'a' [0, 8]"));
}

TEST_F(SafetensorsMalformed, HoleBetweenTensors) {
  const std::string msg =
      open_error(st_bytes(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                          R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                          std::string(12, '\0')));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("bytes [4, 8) of the data section are not covered"));
  EXPECT_THAT(msg, HasSubstr("tensor 'b'"));
}

TEST_F(SafetensorsMalformed, FirstTensorNotAtZero) {
  const std::string msg = open_error(st_bytes(
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", std::string(8, '\0')));
  EXPECT_THAT(msg, HasSubstr("bytes [0, 4) of the data section are not covered"));
  EXPECT_THAT(msg, HasSubstr("tensor 'a'"));
}

TEST_F(SafetensorsMalformed, TrailingBytesNotCovered) {
  const std::string msg = open_error(st_bytes(
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", std::string(10, '\0')));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("6 bytes of the data section are not covered"));
}

TEST_F(SafetensorsMalformed, DataWithoutTensors) {
  EXPECT_THAT(open_error(st_bytes("{}", std::string(3, '\0'))),
              HasSubstr("3 bytes of the data section are not covered"));
}

TEST_F(SafetensorsMalformed, DuplicateTensorName) {
  const std::string msg =
      open_error(st_bytes(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                          R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                          std::string(8, '\0')));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("name 'a' appears more than once"));
}

TEST_F(SafetensorsMalformed, DuplicateKeyInsideEntry) {
  const std::string msg = open_error(
      st_bytes(R"({"a": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
               std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("key 'dtype' appears more than once in the entry for 'a'"));
}

TEST_F(SafetensorsMalformed, MetadataValueNotString) {
  const std::string msg = open_error(st_bytes(R"({"__metadata__": {"ok": "x", "step": 3}})", ""));
  EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
  EXPECT_THAT(msg, HasSubstr("__metadata__ value for key 'step' must be a string, found number 3"));
}

TEST_F(SafetensorsMalformed, MetadataNotObject) {
  EXPECT_THAT(open_error(st_bytes(R"({"__metadata__": ["a"]})", "")),
              HasSubstr("__metadata__ must be an object"));
}

TEST(SafetensorsParse, AcceptsPaddingEmptyAndScalarTensors) {
  // Unpadded header (other writers need not align) with trailing spaces, an empty tensor sharing
  // its offset with the next one, and a 0-rank tensor.
  const std::string bytes = st_bytes(
      R"({"e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]},)"
      R"( "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}, "__metadata__": null}   )",
      std::string(8, '\0'), /*pad=*/false);
  const SafetensorsHeader h =
      parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "e");
  EXPECT_EQ(h.tensors[0].numel(), 0);
  EXPECT_EQ(h.tensors[1].name, "s");
  EXPECT_EQ(h.tensors[1].numel(), 1);
  EXPECT_EQ(h.tensors[1].dtype, at::kDouble);
  EXPECT_EQ(h.data_offset, bytes.size() - 8);
  EXPECT_TRUE(h.metadata.empty());
}

TEST(SafetensorsDtype, NamesMapBothWays) {
  const std::vector<std::pair<std::string, c10::ScalarType>> pairs = {
      {"BOOL", at::kBool}, {"U8", at::kByte},    {"I8", at::kChar},         {"I16", at::kShort},
      {"I32", at::kInt},   {"I64", at::kLong},   {"F16", at::kHalf},        {"BF16", at::kBFloat16},
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"C64", at::kComplexFloat}};
  for (const auto& [name, type] : pairs) {
    EXPECT_EQ(safetensors_dtype(name, "x"), type) << name;
    EXPECT_EQ(safetensors_dtype_name(type), name) << name;
  }
  EXPECT_THAT(input_error([] { safetensors_dtype("Q8", "some.file"); }),
              HasSubstr("some.file: unknown dtype 'Q8'"));
  EXPECT_THAT(input_error([] { safetensors_dtype_name(at::kComplexDouble); }),
              HasSubstr("ComplexDouble"));
}

// Reads the 8-byte length and returns the header text.
std::string header_text(const std::string& file_bytes) {
  uint64_t n = 0;
  std::memcpy(&n, file_bytes.data(), 8);
  return file_bytes.substr(8, n);
}

TEST(SafetensorsRoundTrip, AllSupportedDtypesAndMetadata) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", at::randn({3, 4})},
      {"f64", at::randn({5}, at::kDouble)},
      {"f16", at::randn({2, 3}).to(at::kHalf)},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"bool", at::randn({9}) > 0},
      {"u8", at::arange(0, 250, 7).to(at::kByte)},
      {"i8", at::arange(-100, 100, 9).to(at::kChar)},
      {"i16", at::arange(-3000, 3000, 999).to(at::kShort)},
      {"i32", at::arange(-5, 6).to(at::kInt)},
      {"i64", at::arange(0, 6).mul(int64_t{1} << 40).view({2, 3})},
      {"c64", at::randn({3}, at::kComplexFloat)},
      {"scalar", at::scalar_tensor(3.5)},
      {"empty", at::empty({0, 3})},
  };
  write_safetensors(path, tensors, {{"producer", "actcap"}, {"layer", "7"}});

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("producer"), "actcap");
  EXPECT_EQ(f->metadata().at("layer"), "7");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const at::Tensor got = f->tensor(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type());
    EXPECT_EQ(got.sizes(), t.sizes());
    EXPECT_TRUE(at::equal(got, t));
    EXPECT_EQ(f->find(name)->dtype_name, safetensors_dtype_name(t.scalar_type()));
  }
  EXPECT_EQ(f->tensor("scalar").dim(), 0);
  EXPECT_EQ(f->tensor("scalar").item<double>(), 3.5);
  EXPECT_EQ(f->tensor("empty").numel(), 0);

  const std::string bytes = read_file(path);
  const std::string header = header_text(bytes);
  EXPECT_EQ((8 + header.size()) % 8, 0u);
  EXPECT_EQ(f->header().data_offset, 8 + header.size());
  // __metadata__ first, then tensors in the given order.
  EXPECT_EQ(header.rfind("{\"__metadata__\":", 0), 0u);
  EXPECT_THAT(header, HasSubstr("\"format\":\"pt\""));
  EXPECT_LT(header.find("\"f32\""), header.find("\"f64\""));
  EXPECT_LT(header.find("\"c64\""), header.find("\"empty\""));
  // The file is exactly header plus data, with nothing after.
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.numel() * t.element_size();
  EXPECT_EQ(bytes.size(), 8 + header.size() + total);
}

TEST(SafetensorsRoundTrip, FormatIsAlwaysPt) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  write_safetensors(path, {{"a", at::ones({2})}}, {{"format", "np"}});
  EXPECT_EQ(SafetensorsFile::open(path)->metadata().at("format"), "pt");
}

TEST(SafetensorsRoundTrip, NonContiguousInputIsWrittenInLogicalOrder) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const at::Tensor base = at::arange(12, at::kFloat).view({3, 4});
  const at::Tensor t = base.t();
  ASSERT_FALSE(t.is_contiguous());
  write_safetensors(path, {{"t", t}, {"slice", base.select(1, 2)}}, {});
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(at::equal(f->tensor("t"), t));
  EXPECT_TRUE(at::equal(f->tensor("slice"), base.select(1, 2)));
}

TEST(SafetensorsRoundTrip, NoTensors) {
  TempDir dir;
  const std::string path = dir.file("none.safetensors");
  write_safetensors(path, {}, {});
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(SafetensorsRoundTrip, OverwritesExistingFile) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  write_safetensors(path, {{"a", at::ones({2})}}, {});
  write_safetensors(path, {{"b", at::zeros({3})}}, {});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->find("a"), nullptr);
  ASSERT_NE(f->find("b"), nullptr);
  EXPECT_EQ(dir.entries().size(), 1u);
}

TEST(SafetensorsHeaderJson, LayoutIsContiguousAndPadded) {
  const std::string h =
      safetensors_header_json({{"w", at::zeros({2, 3})}, {"b", at::zeros({3}, at::kHalf)}}, {});
  EXPECT_EQ((8 + h.size()) % 8, 0u);
  const auto j = nlohmann::json::parse(h);
  EXPECT_EQ(j["w"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({24, 30}));
  EXPECT_EQ(j["b"]["dtype"], "F16");
  EXPECT_EQ(j["w"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
}

TEST(SafetensorsReader, AlignedTensorIsZeroCopyAndKeepsMappingAlive) {
  TempDir dir;
  const std::string path = dir.file("z.safetensors");
  const at::Tensor src = at::randn({16, 8});
  write_safetensors(path, {{"x", src}}, {});
  auto f = SafetensorsFile::open(path);
  at::Tensor t = f->tensor("x");
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  EXPECT_GE(p, f->file_bytes());
  EXPECT_LT(p, f->file_bytes() + f->file_size());
  EXPECT_EQ(p, f->data(*f->find("x")));
  // The tensor holds the mapping: dropping every other reference must not unmap it.
  f.reset();
  EXPECT_TRUE(at::equal(t, src));
}

TEST(SafetensorsReader, MisalignedTensorIsCopied) {
  // An I8 of one byte first puts the F32 at data offset 1, misaligned since 8 + N is a multiple
  // of 8 here.
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const float values[2] = {1.5f, -2.25f};
  std::string data(1, '\x7f');
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  write_file(path, st_bytes(R"({"a": {"dtype": "I8", "shape": [1], "data_offsets": [0, 1]},)"
                            R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}})",
                            data));
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->header().data_offset % 8, 0u);
  const at::Tensor b = f->tensor("b");
  const auto* p = static_cast<const uint8_t*>(b.data_ptr());
  EXPECT_TRUE(p < f->file_bytes() || p >= f->file_bytes() + f->file_size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignof(float), 0u);
  EXPECT_FLOAT_EQ(b[0].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(b[1].item<float>(), -2.25f);
  EXPECT_EQ(f->tensor("a").item<int8_t>(), 127);
}

TEST(SafetensorsReader, UnknownTensorName) {
  TempDir dir;
  const std::string path = dir.file("u.safetensors");
  write_safetensors(path, {{"a", at::ones({1})}}, {});
  auto f = SafetensorsFile::open(path);
  const std::string msg = input_error([&] { f->tensor("nope"); });
  EXPECT_THAT(msg, HasSubstr("u.safetensors"));
  EXPECT_THAT(msg, HasSubstr("'nope'"));
}

TEST(SafetensorsReader, MissingFile) {
  TempDir dir;
  const std::string msg = input_error([&] { SafetensorsFile::open(dir.file("gone.safetensors")); });
  EXPECT_THAT(msg, HasSubstr("gone.safetensors"));
  EXPECT_THAT(msg, HasSubstr("No such file"));
}

TEST(SafetensorsWriter, DuplicateNamesRejected) {
  TempDir dir;
  const std::string path = dir.file("d.safetensors");
  const std::string msg = input_error([&] {
    write_safetensors(path, {{"a", at::ones({1})}, {"a", at::ones({2})}}, {});
  });
  EXPECT_THAT(msg, HasSubstr("d.safetensors"));
  EXPECT_THAT(msg, HasSubstr("duplicate tensor name 'a'"));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsWriter, UnrepresentableDtypeRejected) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  const std::string msg = input_error([&] {
    write_safetensors(path, {{"z", at::zeros({2}, at::kComplexDouble)}}, {});
  });
  EXPECT_THAT(msg, HasSubstr("tensor 'z'"));
  EXPECT_THAT(msg, HasSubstr("ComplexDouble"));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsWriter, MissingDirectoryIsRunError) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/x.safetensors");
  try {
    write_safetensors(path, {{"a", at::ones({4})}}, {});
    FAIL() << "expected RunError";
  } catch (const RunError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.what(), HasSubstr("No such file"));
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsWriter, FailedRenameRemovesTemporaryFile) {
  TempDir dir;
  // A non-empty directory at the target path makes rename() fail after all data is written.
  const std::string path = dir.file("target");
  fs::create_directories(fs::path(path) / "inside");
  EXPECT_THROW(write_safetensors(path, {{"a", at::ones({4})}}, {}), RunError);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"target"});
}

TEST(SafetensorsWriter, FileSizeLimitIsRunErrorNotCrash) {
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  // Made before fork: the child must not start LibTorch's thread pools.
  const at::Tensor big = at::zeros({1 << 18});
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rlimit limit = {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::signal(SIGXFSZ, SIG_IGN);
    int code = 0;
    try {
      write_safetensors(path, {{"big", big}}, {});
    } catch (const RunError& e) {
      code = std::strstr(e.what(), "File too large") != nullptr ? 1 : 3;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace actcap

// Found by fuzz_safetensors (fuzz/regressions/fuzz_safetensors): a zero dimension beside huge ones.
TEST(SafetensorsRegression, ZeroDimBesideHugeDimsIsRejected) {
  const std::string header =
      R"({"t":{"dtype":"F32","shape":[0,4611686018427387904,16],"data_offsets":[0,0]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  file += header;
  EXPECT_THROW(
      actcap::parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "z.st"),
      actcap::InputError);
}
