// A read-only memory map of a whole file. Checkpoints are mapped, never read into heap memory:
// the OS pages weights in on first touch and the CPU backend reads them in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lilac {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws lilac::Error naming the path
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Tells the OS this process is done with bytes [offset, offset + n) for now (madvise
  // MADV_DONTNEED on the whole pages inside the range), so a streaming reader's resident set stays
  // bounded; touched again, the bytes read back unchanged from the file.
  void drop_pages(size_t offset, size_t n) const;

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole small file (config.json, an index, a template) into memory. Refuses, as a
// lilac::Error naming the path, anything that is not a regular file (a FIFO would block the reader
// forever, /dev/zero never ends) and files over `max_bytes`.
std::string read_small_file(const std::string& path, size_t max_bytes = 64 << 20);

// Opens `path` read-only without blocking (O_NONBLOCK: a FIFO opens at once instead of waiting
// for a writer) and checks it is a regular file; returns the descriptor and its size.
int open_regular_file(const std::string& path, size_t& size);

}  // namespace lilac
