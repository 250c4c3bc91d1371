// Every defect SafetensorsFile::open must catch, each written by the test as a broken file, and
// each giving an error that names the file and, where there is one, the tensor.
#include "io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "../test_data.h"
#include "util/error.h"

namespace lilac::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

void write_raw(const std::string& path, const std::string& header, const std::string& data,
               uint64_t header_len_override = 0) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << header << data;
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class SafetensorsDefects : public ::testing::Test {
 protected:
  TempDir dir;
  std::string file = dir.str("t.safetensors");
};

TEST_F(SafetensorsDefects, ValidFileRoundTrips) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int32_t> b = {7, -8};
  write_safetensors(file,
                    {{"a", DType::F32, {2, 3}, {reinterpret_cast<const uint8_t*>(a.data()), 24}},
                     {"b", DType::I32, {2}, {reinterpret_cast<const uint8_t*>(b.data()), 8}}},
                    {{"k", "v"}});
  auto f = SafetensorsFile::open(file);
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(read_f32(*f, "a"), a);
  EXPECT_EQ(read_i32(*f, "b"), b);
  EXPECT_EQ(f->find("a")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f->metadata().at("k"), "v");
  EXPECT_EQ(f->find("zzz"), nullptr);
}

TEST_F(SafetensorsDefects, MissingFile) {
  EXPECT_THAT(open_error(dir.str("nope.safetensors")),
              AllOf(HasSubstr("nope.safetensors"), HasSubstr("cannot open")));
}

TEST_F(SafetensorsDefects, TooShortForHeaderLength) {
  std::ofstream(file, std::ios::binary) << "abc";
  EXPECT_THAT(open_error(file), AllOf(HasSubstr(file), HasSubstr("too short")));
}

TEST_F(SafetensorsDefects, HeaderLengthPastEndOfFile) {
  write_raw(file, "{}", "", 1000);
  EXPECT_THAT(open_error(file), AllOf(HasSubstr(file), HasSubstr("header length 1000")));
}

TEST_F(SafetensorsDefects, ImplausibleHeaderLength) {
  write_raw(file, "{}", "", uint64_t(1) << 62);
  EXPECT_THAT(open_error(file), HasSubstr("implausible"));
}

TEST_F(SafetensorsDefects, HeaderNotJson) {
  write_raw(file, "{\"a\": [1, 2", "");
  EXPECT_THAT(open_error(file), HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsDefects, HeaderNotObject) {
  write_raw(file, "[1, 2, 3]", "");
  EXPECT_THAT(open_error(file), HasSubstr("not an object"));
}

TEST_F(SafetensorsDefects, UnknownDtype) {
  write_raw(file, R"({"w": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 2]}})", "xx");
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'w'"), HasSubstr("unknown dtype 'Q4_K'")));
}

TEST_F(SafetensorsDefects, NegativeDimension) {
  write_raw(file, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "xxxx");
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'w'"), HasSubstr("negative")));
}

TEST_F(SafetensorsDefects, MissingOffsets) {
  write_raw(file, R"({"w": {"dtype": "F32", "shape": [1]}})", "xxxx");
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'w'"), HasSubstr("data_offsets")));
}

TEST_F(SafetensorsDefects, SizeDisagreesWithShape) {
  write_raw(file, R"({"w": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 8]}})",
            std::string(8, 'x'));
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'w'"), HasSubstr("needs 12 bytes")));
}

TEST_F(SafetensorsDefects, TruncatedData) {
  write_raw(file, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
            std::string(10, 'x'));
  EXPECT_THAT(open_error(file),
              AllOf(HasSubstr("'w'"), HasSubstr("past the end"), HasSubstr("truncated")));
}

TEST_F(SafetensorsDefects, EndBeforeBegin) {
  write_raw(file, R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})",
            std::string(8, 'x'));
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'w'"), HasSubstr("end before begin")));
}

TEST_F(SafetensorsDefects, OverlappingTensors) {
  write_raw(file,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            std::string(12, 'x'));
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'a'"), HasSubstr("'b'"), HasSubstr("overlap")));
}

TEST_F(SafetensorsDefects, DuplicateTensorName) {
  write_raw(file,
            R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            std::string(8, 'x'));
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'a'"), HasSubstr("twice")));
}

TEST_F(SafetensorsDefects, ShapeOverflow) {
  write_raw(
      file,
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})",
      "xxxx");
  EXPECT_THAT(open_error(file), AllOf(HasSubstr("'w'"), HasSubstr("overflows")));
}

TEST_F(SafetensorsDefects, ReadRejectsWrongTypes) {
  std::vector<float> a = {1};
  write_safetensors(file,
                    {{"a", DType::F32, {1}, {reinterpret_cast<const uint8_t*>(a.data()), 4}}});
  auto f = SafetensorsFile::open(file);
  EXPECT_THROW(read_i32(*f, "a"), Error);
  EXPECT_THROW(read_f32(*f, "missing"), Error);
}

}  // namespace
}  // namespace lilac::test
